#pragma once
/// \file
/// The activations of Flux's text encoders, computed with the same chain of operations as
/// transformers (src/transformers/activations.py: NewGELUActivation for gelu_new,
/// QuickGELUActivation for quick_gelu), so bf16 results round exactly as upstream does.
/// A fused kernel (at::gelu(x, "tanh")) computes in fp32 and rounds once; these round after every
/// op, as transformers' Python does, and can differ from the fused kernel in the last bits.

#include <ATen/ATen.h>

#include "remat/export.h"

namespace remat::encoders {

/// CLIP's quick_gelu: x * sigmoid(1.702 * x).
REMAT_API at::Tensor quick_gelu(const at::Tensor& x);
/// quick_gelu for a tensor nothing else reads (an intermediate handed over by value): when
/// autograd does not record x, computed with one buffer besides x, bit for bit equal to
/// quick_gelu. Otherwise quick_gelu itself.
REMAT_API at::Tensor quick_gelu_consuming(at::Tensor x);

/// T5 v1.1's gelu_new (the tanh approximation of GELU):
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as transformers' NewGELUActivation orders it.
REMAT_API at::Tensor gelu_new(const at::Tensor& x);
/// gelu_new for a tensor nothing else reads: when autograd does not record x, computed in x's
/// storage and one buffer (gelu_new holds up to five), bit for bit equal to gelu_new; x is
/// overwritten. Otherwise gelu_new itself.
REMAT_API at::Tensor gelu_new_consuming(at::Tensor x);

}  // namespace remat::encoders
