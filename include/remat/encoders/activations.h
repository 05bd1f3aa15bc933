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

/// T5 v1.1's gelu_new (the tanh approximation of GELU):
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as transformers' NewGELUActivation orders it.
REMAT_API at::Tensor gelu_new(const at::Tensor& x);

}  // namespace remat::encoders
