#pragma once
/// \file
/// The building blocks of diffusers' AutoencoderKL (src/diffusers/models/: resnet.py,
/// downsampling.py, upsampling.py, attention_processor.py, unets/unet_2d_blocks.py), registered
/// under diffusers' key names: ResnetBlock2D (`norm1 conv1 norm2 conv2 [conv_shortcut]`),
/// Downsample2D (`conv`), Upsample2D (`conv`), the mid-block attention
/// (`group_norm to_q to_k to_v to_out.0`) and UNetMidBlock2D (`attentions.0 resnets.{0,1}`).
/// Every GroupNorm uses eps 1e-6. Inputs are (B, C, H, W) in the dtype of the weights
/// (fp32, bf16 or fp16; float64 for tests).

#include <cstdint>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "remat/encoders/autoencoder_kl_config.h"
#include "remat/export.h"

namespace remat::encoders {

/// GroupNorm's eps in every block of the VAE (diffusers' resnet_eps).
inline constexpr double kVaeNormEps = 1e-6;

/// The resnet activations diffusers' get_activation knows (act_fn, case-insensitive).
enum class VaeActivation { kSilu, kMish, kGelu, kRelu };

/// Parses act_fn ("silu" and "swish" are the same function). Throws remat::throw_value_error
/// naming the value and the valid names.
REMAT_API VaeActivation parse_vae_activation(const std::string& act_fn);
/// Applies `act` (torch's fused kernels: silu, mish, exact-erf gelu, relu).
REMAT_API at::Tensor apply_activation(const at::Tensor& x, VaeActivation act);
/// apply_activation, or the same activation written over `x` when `in_place` (no autograd).
REMAT_API at::Tensor activate(at::Tensor x, VaeActivation act, bool in_place);

/// ResnetBlock2D in the VAE form (no time embedding, output scale 1, dropout 0):
/// h = conv1(act(norm1(x))); h = conv2(act(norm2(h))); y = shortcut(x) + h, where shortcut is a
/// 1x1 conv when c_in != c_out and the identity otherwise.
class REMAT_API ResnetBlock2DImpl : public torch::nn::Module {
 public:
  ResnetBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t groups, VaeActivation act);
  /// (B, c_in, H, W) -> (B, c_out, H, W).
  at::Tensor forward(const at::Tensor& x);

  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Conv2d conv_shortcut{nullptr};  ///< null when c_in == c_out
  VaeActivation act;
};
TORCH_MODULE(ResnetBlock2D);

/// Downsample2D: zero-pad one column right and one row at the bottom (F.pad (0,1,0,1)), then a
/// 3x3 conv with stride 2 and no padding: (B, C, H, W) -> (B, C, floor(H/2), floor(W/2)).
class REMAT_API Downsample2DImpl : public torch::nn::Module {
 public:
  explicit Downsample2DImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Downsample2D);

/// Upsample2D: nearest-neighbour x2 (out[y, x] = in[y/2, x/2]), then a 3x3 conv with padding 1:
/// (B, C, H, W) -> (B, C, 2H, 2W).
class REMAT_API Upsample2DImpl : public torch::nn::Module {
 public:
  explicit Upsample2DImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Upsample2D);

/// The mid block's single-head self-attention over the H x W positions (diffusers' Attention with
/// AttnProcessor2_0, attention_processor.py):
/// t = GroupNorm(x) as (B, HW, C); y = to_out.0(softmax(q k^T / sqrt(C)) v) back to (B, C, H, W),
/// plus x. Queries are processed in chunks (Note [Chunked attention] in vae_blocks.cpp), so a
/// 1024x1024 image never holds the 16384 x 16384 score matrix. For bf16/fp16 inputs the scores,
/// softmax and value product run in fp32 and the result is rounded once, as torch's fused
/// scaled_dot_product_attention kernels (which diffusers calls) accumulate in fp32.
class REMAT_API VaeAttentionImpl : public torch::nn::Module {
 public:
  VaeAttentionImpl(int64_t channels, int64_t groups);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::GroupNorm group_norm{nullptr};
  torch::nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
  torch::nn::ModuleList to_out{nullptr};  ///< to_out.0 (Linear); diffusers' to_out.1 is Dropout(0)
  /// Queries per chunk of the score matrix (a performance knob; results do not depend on it
  /// beyond the last bits of matmul blocking).
  int64_t query_chunk = kVaeAttentionQueryChunk;
};
TORCH_MODULE(VaeAttention);

/// UNetMidBlock2D as the VAE builds it: resnets.0, [attentions.0], resnets.1, all C -> C.
/// diffusers registers `attentions` before `resnets`, and so does this module.
class REMAT_API VaeMidBlockImpl : public torch::nn::Module {
 public:
  VaeMidBlockImpl(int64_t channels, int64_t groups, VaeActivation act, bool add_attention);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::ModuleList attentions{nullptr};  ///< empty without mid-block attention
  torch::nn::ModuleList resnets{nullptr};
};
TORCH_MODULE(VaeMidBlock);

}  // namespace remat::encoders
