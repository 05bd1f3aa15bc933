// The AutoencoderKL blocks (diffusers models/resnet.py ResnetBlock2D,
// downsampling.py Downsample2D, upsampling.py Upsample2D, attention_processor.py Attention with
// AttnProcessor2_0, unets/unet_2d_blocks.py UNetMidBlock2D).

#include "string_helpers.h"
#include "remat/encoders/vae_blocks.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/StringUtil.h>

#include "remat/util/error.h"

namespace remat::encoders {
namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t padding) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(padding).bias(true));
}

torch::nn::GroupNorm group_norm(int64_t groups, int64_t channels) {
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups, channels).eps(kVaeNormEps).affine(true));
}

bool is_reduced_float(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

}  // namespace

VaeActivation parse_vae_activation(const std::string& act_fn) {
  const std::string s = remat::detail::lower(act_fn);
  if (s == "silu" || s == "swish") return VaeActivation::kSilu;
  if (s == "mish") return VaeActivation::kMish;
  if (s == "gelu") return VaeActivation::kGelu;
  if (s == "relu") return VaeActivation::kRelu;
  throw_value_error("[vae] act_fn must be one of silu, swish, mish, gelu, relu, got '" + act_fn + "'");
}

at::Tensor apply_activation(const at::Tensor& x, VaeActivation act) {
  switch (act) {
    case VaeActivation::kSilu: return at::silu(x);
    case VaeActivation::kMish: return at::mish(x);
    case VaeActivation::kGelu: return at::gelu(x);
    case VaeActivation::kRelu: return at::relu(x);
  }
  TORCH_INTERNAL_ASSERT(false, "unknown VaeActivation");
}

at::Tensor activate(at::Tensor x, VaeActivation act, bool in_place) {
  if (!in_place) return apply_activation(x, act);
  switch (act) {
    case VaeActivation::kSilu: return at::silu_(x);
    case VaeActivation::kMish: return at::mish_(x);
    case VaeActivation::kGelu: return at::gelu_(x);
    case VaeActivation::kRelu: return at::relu_(x);
  }
  TORCH_INTERNAL_ASSERT(false, "unknown VaeActivation");
}

// ---- ResnetBlock2D ----
ResnetBlock2DImpl::ResnetBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t groups, VaeActivation act_)
    : act(act_) {
  // Registration order = diffusers' state_dict order.
  norm1 = register_module("norm1", group_norm(groups, in_channels));
  conv1 = register_module("conv1", conv(in_channels, out_channels, 3, 1, 1));
  norm2 = register_module("norm2", group_norm(groups, out_channels));
  conv2 = register_module("conv2", conv(out_channels, out_channels, 3, 1, 1));
  if (in_channels != out_channels) {
    conv_shortcut = register_module("conv_shortcut", conv(in_channels, out_channels, 1, 1, 0));
  }
}

// Tensor lifetimes follow diffusers' ResnetBlock2D.forward (models/resnet.py), which rebinds
// `hidden_states` after every op so each intermediate is freed once the next exists. Without
// autograd the activation and the residual sum run in place (nothing else holds those tensors), so
// the block never holds more than its input and two full-size activations.
at::Tensor ResnetBlock2DImpl::forward(const at::Tensor& x) {
  const bool in_place = !at::GradMode::is_enabled();
  at::Tensor h = activate(norm1(x), act, in_place);
  h = conv1(h);
  h = activate(norm2(h), act, in_place);
  h = conv2(h);
  // diffusers: (input_tensor + hidden_states) / output_scale_factor, with the factor 1.
  if (!in_place) return (conv_shortcut ? conv_shortcut(x) : x) + h;
  return conv_shortcut ? h.add_(conv_shortcut(x)) : h.add_(x);
}

// ---- Downsample2D ----
Downsample2DImpl::Downsample2DImpl(int64_t channels) {
  conv = register_module("conv", encoders::conv(channels, channels, 3, 2, 0));
}

at::Tensor Downsample2DImpl::forward(const at::Tensor& x) {
  // Asymmetric: symmetric padding 1 would shift the sampling grid by one pixel.
  return conv(at::constant_pad_nd(x, {0, 1, 0, 1}, 0));
}

// ---- Upsample2D ----
Upsample2DImpl::Upsample2DImpl(int64_t channels) {
  conv = register_module("conv", encoders::conv(channels, channels, 3, 1, 1));
}

at::Tensor Upsample2DImpl::forward(const at::Tensor& x) {
  // Nearest-neighbour only copies values, so going through fp32 for reduced floats (as diffusers
  // does under torch < 2.1, where the kernel lacked bf16) is exact.
  const bool reduced = is_reduced_float(x.scalar_type());
  at::Tensor up = at::upsample_nearest2d(reduced ? x.to(at::kFloat) : x, {2 * x.size(2), 2 * x.size(3)});
  if (reduced) up = up.to(x.scalar_type());
  return conv(up);
}

// ---- mid-block attention ----
VaeAttentionImpl::VaeAttentionImpl(int64_t channels, int64_t groups) {
  group_norm = register_module("group_norm", encoders::group_norm(groups, channels));
  to_q = register_module("to_q", torch::nn::Linear(channels, channels));
  to_k = register_module("to_k", torch::nn::Linear(channels, channels));
  to_v = register_module("to_v", torch::nn::Linear(channels, channels));
  to_out = register_module("to_out", torch::nn::ModuleList(torch::nn::Linear(channels, channels)));
}

// Note [Chunked attention]
// Softmax rows are independent, so splitting the queries into chunks computes the same rows as
// one (HW x HW) score matrix while holding only (chunk x HW) of it: at 1024x1024 the full matrix
// is 16384^2 fp32 = 1 GiB per image, a chunk of 1024 queries is 64 MiB. diffusers calls
// F.scaled_dot_product_attention, whose fused kernels also never materialise the whole matrix.
at::Tensor VaeAttentionImpl::forward(const at::Tensor& x) {
  if (!(x.dim() == 4)) {
    throw_value_error(c10::str("[vae] attention input must be (B, C, H, W), got ", x.sizes()));
  }
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  at::Tensor t = group_norm(x.view({B, C, H * W})).transpose(1, 2);  // (B, HW, C)
  at::Tensor q = to_q(t), k = to_k(t), v = to_v(t);
  t.reset();  // not needed past the projections
  const auto dtype = x.scalar_type();
  const bool reduced = is_reduced_float(dtype);
  if (reduced) {
    q = q.to(at::kFloat);
    k = k.to(at::kFloat);
    v = v.to(at::kFloat);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(C));
  const at::Tensor kt = k.transpose(1, 2);
  const int64_t L = H * W, chunk = std::max<int64_t>(1, query_chunk);
  at::Tensor o = at::empty_like(q);
  for (int64_t s = 0; s < L; s += chunk) {
    const int64_t e = std::min(L, s + chunk);
    const at::Tensor scores = at::matmul(q.slice(1, s, e), kt).mul_(scale);
    o.slice(1, s, e).copy_(at::matmul(at::softmax(scores, -1), v));
  }
  if (reduced) o = o.to(dtype);
  o = to_out[0]->as<torch::nn::Linear>()->forward(o);
  // diffusers: transpose(-1, -2).reshape(B, C, H, W) + residual, / rescale_output_factor (1).
  return o.transpose(1, 2).reshape({B, C, H, W}) + x;
}

// ---- UNetMidBlock2D ----
VaeMidBlockImpl::VaeMidBlockImpl(int64_t channels, int64_t groups, VaeActivation act, bool add_attention) {
  attentions = register_module("attentions", torch::nn::ModuleList());
  if (add_attention) attentions->push_back(VaeAttention(channels, groups));
  resnets = register_module("resnets", torch::nn::ModuleList());
  resnets->push_back(ResnetBlock2D(channels, channels, groups, act));
  resnets->push_back(ResnetBlock2D(channels, channels, groups, act));
}

at::Tensor VaeMidBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = resnets[0]->as<ResnetBlock2D>()->forward(x);
  if (!attentions->is_empty()) h = attentions[0]->as<VaeAttention>()->forward(h);
  return resnets[1]->as<ResnetBlock2D>()->forward(h);
}

}  // namespace remat::encoders
