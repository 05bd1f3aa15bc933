// Quantising the Linear layers of a built module, and building one quantised without its
// full-precision weights (DeferLinearWeights -> resolve_deferred_linears -> load or initialise).

#include <algorithm>
#include <cmath>

#include <torch/nn/init.h>
#include <torch/torch.h>

#include "remat/util/error.h"
#include "remat/models/layers.h"
#include "remat/models/quantization.h"

namespace remat::models {
namespace {

thread_local bool defer_linear_weights = false;

template <typename Visit>
void for_each_linear(torch::nn::Module& module, Visit visit) {
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    if (auto* linear = dynamic_cast<LinearImpl*>(item.value().get())) visit(item.key(), *linear);
  }
}

}  // namespace

DeferLinearWeights::DeferLinearWeights() {
  TORCH_CHECK(!defer_linear_weights, "[quant] DeferLinearWeights is already active on this thread");
  defer_linear_weights = true;
}
DeferLinearWeights::~DeferLinearWeights() { defer_linear_weights = false; }
bool DeferLinearWeights::active() { return defer_linear_weights; }

std::vector<std::string> resolve_deferred_linears(torch::nn::Module& module, const BasePrecision& precision) {
  std::vector<std::string> waiting;
  for_each_linear(module, [&](const std::string& name, LinearImpl& linear) {
    if (!linear.is_deferred() || linear.awaits_weight()) return;
    if (precision.mode != WeightQuantization::none && is_quantized_linear_name(name)) {
      linear.await_weight(precision);
      waiting.push_back(name);
    } else {
      linear.await_weight(BasePrecision{});  // full precision, initialised now
    }
  });
  return waiting;
}

void initialize_awaiting_linears(torch::nn::Module& module) {
  for_each_linear(module, [](const std::string&, LinearImpl& linear) {
    if (!linear.awaits_weight()) return;
    // torch.nn.Linear's initialisation, one full weight alive at a time.
    at::Tensor full = torch::empty({linear.out_features(), linear.in_features()},
                                   at::TensorOptions().dtype(at::kFloat).device(linear.weight_device()));
    {
      torch::NoGradGuard no_grad;
      torch::nn::init::kaiming_uniform_(full, std::sqrt(5.0));
    }
    linear.load_awaited_weight(full.to(linear.weight_dtype()));
  });
}

std::vector<std::string> awaiting_weight_keys(torch::nn::Module& module) {
  std::vector<std::string> keys;
  for_each_linear(module, [&](const std::string& name, LinearImpl& linear) {
    if (linear.awaits_weight()) keys.push_back(name + ".weight");
  });
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::vector<std::string> quantize_linear_layers(torch::nn::Module& module, const BasePrecision& precision) {
  std::vector<std::string> names;
  if (precision.mode == WeightQuantization::none) return names;
  for_each_linear(module, [&](const std::string& name, LinearImpl& linear) {
    if (!is_quantized_linear_name(name) || linear.is_quantized() || !linear.weight.defined()) return;
    linear.set_quantized_weight(quantize_weight(linear.weight, precision.mode, precision.double_quantization));
    names.push_back(name);
  });
  return names;
}

}  // namespace remat::models
