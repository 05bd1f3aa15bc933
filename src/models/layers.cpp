#include "remat/models/layers.h"

#include <cmath>

#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/torch.h>

namespace remat::models {

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias)
    : in_features_(in_features), out_features_(out_features), dtype_(c10::typeMetaToScalarType(at::get_default_dtype())) {
  TORCH_CHECK_VALUE(in_features >= 1, "[Linear] in_features must be >= 1, got ", in_features);
  TORCH_CHECK_VALUE(out_features >= 1, "[Linear] out_features must be >= 1, got ", out_features);
  if (DeferLinearWeights::active()) {
    // Built to be quantised: the full weight is created (or streamed from a file) later, one
    // layer at a time (remat/models/quantization.h).
    deferred_ = true;
  } else {
    weight = register_parameter("weight", torch::empty({out_features, in_features}));
    // torch.nn.Linear's default initialisation, so freshly built models behave like PyTorch ones.
    torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  }
  if (with_bias) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    bias = register_parameter("bias", torch::empty({out_features}));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  TORCH_CHECK(!deferred_, "[Linear] this layer was built under DeferLinearWeights and has no weight yet "
                          "(resolve_deferred_linears, then load or initialize_awaiting_linears)");
  at::Tensor y = is_quantized() ? quantized_linear(x, quantized_, bias) : at::linear(x, weight, bias);
  if (has_lora()) {
    // The factors may be kept in another dtype than the base weight (float32 LoRA on a bfloat16
    // model); compute the branch in theirs and add it in the base output's.
    const auto lora_dtype = lora_A->weight.scalar_type();
    at::Tensor delta = lora_B->forward(lora_A->forward(x.to(lora_dtype))) * lora_scale_;
    y = y + delta.to(y.scalar_type());
  }
  return y;
}

void LinearImpl::enable_lora(int64_t rank, double alpha) {
  TORCH_CHECK(!has_lora(), "[Linear] LoRA is already enabled on this layer");
  TORCH_CHECK_VALUE(rank >= 1, "[Linear] LoRA rank must be >= 1, got ", rank);
  TORCH_CHECK_VALUE(alpha > 0.0, "[Linear] LoRA alpha must be > 0, got ", alpha);
  lora_A = register_module(
      "lora_A", torch::nn::Linear(torch::nn::LinearOptions(in_features_, rank).bias(false)));
  lora_B = register_module(
      "lora_B", torch::nn::Linear(torch::nn::LinearOptions(rank, out_features_).bias(false)));
  {
    torch::NoGradGuard no_grad;
    // PEFT's init_lora_weights=True: A kaiming-uniform(a = sqrt(5)), B zero.
    torch::nn::init::kaiming_uniform_(lora_A->weight, std::sqrt(5.0));
    lora_B->weight.zero_();
  }
  lora_A->to(weight_device(), weight_dtype());
  lora_B->to(weight_device(), weight_dtype());
  lora_rank_ = rank;
  lora_scale_ = alpha / static_cast<double>(rank);
}

at::ScalarType LinearImpl::weight_dtype() const { return weight.defined() ? weight.scalar_type() : dtype_; }

c10::Device LinearImpl::weight_device() const {
  if (weight.defined()) return weight.device();
  if (quantized_.data.defined()) return quantized_.data.device();
  return bias.defined() ? bias.device() : device_;
}

at::Tensor LinearImpl::full_weight() const {
  if (is_quantized()) return dequantize_weight(quantized_, weight_dtype());
  TORCH_CHECK(weight.defined(), "[Linear] this layer has no weight yet (built under DeferLinearWeights)");
  return weight;
}

void LinearImpl::set_quantized_weight(QuantizedWeight q) {
  TORCH_CHECK_VALUE(q.mode != WeightQuantization::none && q.out_features == out_features_ &&
                        q.in_features == in_features_,
                    "[Linear] a quantised weight (", to_string(q.mode), ", ", q.out_features, " x ", q.in_features,
                    ") for a layer of ", out_features_, " x ", in_features_);
  dtype_ = weight_dtype();
  device_ = weight_device();
  if (parameters_.find("weight") != nullptr) parameters_.erase("weight");
  weight = at::Tensor();  // the last reference: the full weight is freed here
  quantized_ = std::move(q);
  deferred_ = false;
  awaited_ = BasePrecision{};
}

void LinearImpl::await_weight(const BasePrecision& precision) {
  TORCH_CHECK(deferred_, "[Linear] await_weight: the layer already has its weight");
  if (precision.mode != WeightQuantization::none) {
    awaited_ = precision;
    return;
  }
  at::Tensor w = torch::empty({out_features_, in_features_}, at::TensorOptions().dtype(dtype_).device(weight_device()));
  torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0));
  weight = register_parameter("weight", w);
  deferred_ = false;
}

void LinearImpl::load_awaited_weight(const at::Tensor& full) {
  TORCH_CHECK(awaits_weight(), "[Linear] load_awaited_weight: the layer is not waiting for a weight");
  TORCH_CHECK_VALUE(full.dim() == 2 && full.size(0) == out_features_ && full.size(1) == in_features_,
                    "[Linear] load_awaited_weight: weight of shape ", full.sizes(), " for a layer of ",
                    out_features_, " x ", in_features_);
  set_quantized_weight(quantize_weight(full.to(weight_device()), awaited_.mode, awaited_.double_quantization));
}

void LinearImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  // The quantised data keeps its format; it follows the device, and the dtype says what it
  // dequantises to.
  if (is_quantized()) quantized_ = quantized_.to(device);
  device_ = device;
  dtype_ = dtype;
}

void LinearImpl::to(torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(dtype, non_blocking);
  dtype_ = dtype;
}

void LinearImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  if (is_quantized()) quantized_ = quantized_.to(device);
  device_ = device;
}

at::Tensor layer_norm(const at::Tensor& x, double eps) {
  return at::layer_norm(x, {x.size(-1)}, {}, {}, eps);
}

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return layer_norm(x) * (1 + scale) + shift;
}

at::Tensor gelu_tanh(const at::Tensor& x) { return at::gelu(x, "tanh"); }

at::Tensor clip_fp16(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? x.clamp(-65504.0, 65504.0) : x;
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  TORCH_CHECK_VALUE(dim >= 1, "[RMSNorm] dim must be >= 1, got ", dim);
  weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const auto input_dtype = x.scalar_type();
  // Normalise in at least float32 (float64 stays float64 so double-precision tests stay exact).
  const auto compute = input_dtype == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor xf = x.to(compute);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  const auto wdtype = weight.scalar_type();
  if (wdtype == at::kHalf || wdtype == at::kBFloat16) {
    return normed.to(wdtype) * weight;
  }
  return (normed * weight).to(input_dtype);
}

GeluProjectionImpl::GeluProjectionImpl(int64_t in_features, int64_t out_features) {
  proj = register_module("proj", Linear(in_features, out_features));
}

at::Tensor GeluProjectionImpl::forward(const at::Tensor& x) { return gelu_tanh(proj->forward(x)); }

FeedForwardImpl::FeedForwardImpl(int64_t dim, int64_t mult) {
  TORCH_CHECK_VALUE(mult >= 1, "[FeedForward] mult must be >= 1, got ", mult);
  proj_in_ = GeluProjection(dim, dim * mult);
  proj_out_ = Linear(dim * mult, dim);
  // Index 1 is diffusers' Dropout(p = 0): kept so the last Linear is `net.2` as in the checkpoints.
  net = register_module("net", torch::nn::ModuleList(proj_in_, torch::nn::Dropout(0.0), proj_out_));
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  return proj_out_->forward(proj_in_->forward(x));
}

MlpEmbedderImpl::MlpEmbedderImpl(int64_t in_features, int64_t dim) {
  linear_1 = register_module("linear_1", Linear(in_features, dim));
  linear_2 = register_module("linear_2", Linear(dim, dim));
}

at::Tensor MlpEmbedderImpl::forward(const at::Tensor& x) {
  return linear_2->forward(at::silu(linear_1->forward(x)));
}

AdaLayerNormZeroImpl::AdaLayerNormZeroImpl(int64_t dim) {
  linear = register_module("linear", Linear(dim, 6 * dim));
}

Modulation AdaLayerNormZeroImpl::forward(const at::Tensor& temb) {
  return linear->forward(at::silu(temb)).chunk(6, -1);
}

AdaLayerNormZeroSingleImpl::AdaLayerNormZeroSingleImpl(int64_t dim) {
  linear = register_module("linear", Linear(dim, 3 * dim));
}

Modulation AdaLayerNormZeroSingleImpl::forward(const at::Tensor& temb) {
  return linear->forward(at::silu(temb)).chunk(3, -1);
}

AdaLayerNormContinuousImpl::AdaLayerNormContinuousImpl(int64_t dim) {
  linear = register_module("linear", Linear(dim, 2 * dim));
}

Modulation AdaLayerNormContinuousImpl::forward(const at::Tensor& temb, at::ScalarType dtype) {
  return linear->forward(at::silu(temb).to(dtype)).chunk(2, -1);
}

at::Tensor flux_timestep_projection(const at::Tensor& t, int64_t num_channels) {
  TORCH_CHECK_VALUE(num_channels >= 2 && num_channels % 2 == 0,
                    "[timestep] num_channels must be even and >= 2, got ", num_channels);
  TORCH_CHECK_VALUE(t.dim() == 1, "[timestep] timestep must be 1-D (B), got shape ", t.sizes());
  const int64_t half = num_channels / 2;
  const auto opts = t.options().dtype(at::kFloat);
  // diffusers get_timestep_embedding: exponent = -ln(10000) * k / (half - downscale_freq_shift).
  at::Tensor freq = at::exp(at::arange(half, opts) * (-std::log(10000.0) / static_cast<double>(half)));
  at::Tensor arg = t.to(at::kFloat).unsqueeze(1) * freq.unsqueeze(0);
  // flip_sin_to_cos: [cos | sin].
  return at::cat({at::cos(arg), at::sin(arg)}, -1);
}

at::Tensor mageflow_timestep_projection(const at::Tensor& t, int64_t num_channels,
                                        at::ScalarType dtype) {
  TORCH_CHECK_VALUE(num_channels >= 2 && num_channels % 2 == 0,
                    "[timestep] num_channels must be even and >= 2, got ", num_channels);
  TORCH_CHECK_VALUE(t.dim() == 1, "[timestep] timesteps must be 1-D (n), got shape ", t.sizes());
  const int64_t half = num_channels / 2;
  const auto opts = t.options().dtype(at::kFloat);
  // Vendored mage_layers.get_timestep_embedding, called after MageFlow.forward's
  // `timesteps.to(img.dtype)`: t and the float32 table are cast to the activation dtype, so both
  // are rounded only in a bfloat16 / half model. The product takes t as float32 and promotes
  // (float32, or float64 for a float64 table), as there.
  at::Tensor freq =
      at::exp(at::arange(half, opts) * (-std::log(10000.0) / static_cast<double>(half))).to(dtype);
  at::Tensor arg = (t.to(dtype).to(at::kFloat).unsqueeze(1) * freq.unsqueeze(0)) * 1000.0;
  return at::cat({at::cos(arg), at::sin(arg)}, -1);
}

}  // namespace remat::models
