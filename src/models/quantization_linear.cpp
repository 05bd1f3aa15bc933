// The matmul of a quantised Linear: a custom autograd function that dequantises the weight in
// forward and again in backward, so no dequantised copy outlives either call and nothing large is
// saved for backward (the frozen weight takes no gradient, so x is not needed either).

#include <torch/autograd.h>

#include "remat/util/error.h"
#include "remat/models/quantization.h"

namespace remat::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Saved as references to the layer's own (small, quantised) tensors: no copy is made.
void save_weight(AutogradContext* ctx, const QuantizedWeight& w) {
  ctx->saved_data["mode"] = static_cast<int64_t>(w.mode);
  ctx->saved_data["out"] = w.out_features;
  ctx->saved_data["in"] = w.in_features;
  ctx->saved_data["data"] = w.data;
  ctx->saved_data["scales"] = w.scales;
  ctx->saved_data["scale_scales"] = w.scale_scales;
  ctx->saved_data["scale_offset"] = w.scale_offset;
}

QuantizedWeight saved_weight(AutogradContext* ctx) {
  QuantizedWeight w;
  w.mode = static_cast<WeightQuantization>(ctx->saved_data["mode"].toInt());
  w.out_features = ctx->saved_data["out"].toInt();
  w.in_features = ctx->saved_data["in"].toInt();
  w.data = ctx->saved_data["data"].toTensor();
  w.scales = ctx->saved_data["scales"].toTensor();
  const auto& ss = ctx->saved_data["scale_scales"];
  const auto& so = ctx->saved_data["scale_offset"];
  if (ss.isTensor()) w.scale_scales = ss.toTensor();
  if (so.isTensor()) w.scale_offset = so.toTensor();
  return w;
}

struct QuantizedMatmul : public torch::autograd::Function<QuantizedMatmul> {
  // x (..., in) -> x W^T (..., out) in the dtype of x.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const QuantizedWeight& weight) {
    save_weight(ctx, weight);
    return at::linear(x, dequantize_weight(weight, x.scalar_type()));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& grad = grad_outputs[0];
    // dL/dx = dL/dy W, with W dequantised again (in the gradient's dtype) and freed on return.
    return {at::matmul(grad, dequantize_weight(saved_weight(ctx), grad.scalar_type())), at::Tensor()};
  }
};

}  // namespace

at::Tensor quantized_linear(const at::Tensor& x, const QuantizedWeight& weight, const at::Tensor& bias) {
  if (weight.mode == WeightQuantization::none) {
    throw_value_error("[quant] quantized_linear: the weight is not quantised (mode none)");
  }
  if (x.dim() < 1 || x.size(-1) != weight.in_features) {
    throw_value_error("[quant] quantized_linear: input with last dimension " +
                      (x.dim() < 1 ? std::string("(none: a scalar)") : std::to_string(x.size(-1))) +
                      " for a weight of " + std::to_string(weight.in_features) + " input features");
  }
  at::Tensor y = QuantizedMatmul::apply(x, weight);
  // The bias is added outside the function so it trains when someone unfreezes it.
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

}  // namespace remat::models
