// Building and loading models with quantised base weights, streaming (remat/models/quantized_loading.h).

#include "string_helpers.h"
#include "remat/models/quantized_loading.h"

#include <map>

#include <torch/torch.h>

#include "remat/util/error.h"
#include "remat/models/layers.h"

namespace remat::models {
namespace {

using remat::detail::shape_text;

std::map<std::string, LinearImpl*> awaiting_by_key(torch::nn::Module& module) {
  std::map<std::string, LinearImpl*> out;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    if (linear != nullptr && linear->awaits_weight()) out[item.key() + ".weight"] = linear;
  }
  return out;
}


}  // namespace

void load_state_dict_quantizing(torch::nn::Module& module, const std::vector<io::SafetensorsFile>& files) {
  const auto awaiting = awaiting_by_key(module);
  if (awaiting.empty()) {
    io::load_state_dict_into(module, files);
    return;
  }
  std::map<std::string, const io::SafetensorsFile*> owner;
  for (const auto& f : files) {
    for (const auto& k : f.names()) owner.emplace(k, &f);
  }
  // 1. Check the waiting keys (the rest is checked by load_state_dict_into before it copies).
  for (const auto& entry : awaiting) {
    const std::string& key = entry.first;
    const LinearImpl& linear = *entry.second;
    const auto found = owner.find(key);
    if (found == owner.end()) {
      throw_value_error("[quant] no weights file has " + key + ", which the model needs");
    }
    const auto& info = found->second->info(key);
    const std::vector<int64_t> expected{linear.out_features(), linear.in_features()};
    if (info.shape != expected) {
      throw_value_error("[quant] " + found->second->path() + ": " + key + " has shape " + shape_text(info.shape) +
                        ", the model needs " + shape_text(expected) + " (a checkpoint for another model shape?)");
    }
    if (!at::isFloatingType(info.dtype)) {
      throw_value_error("[quant] " + found->second->path() + ": " + key + " must be a floating tensor, is " +
                        std::string(c10::toString(info.dtype)));
    }
  }
  // 2. Everything else, strictly; then 3. the waiting weights, one zero-copy view at a time.
  io::LoadOptions options;
  options.key_filter = [&awaiting](const std::string& key) { return awaiting.count(key) == 0; };
  io::load_state_dict_into(module, files, options);
  torch::NoGradGuard no_grad;
  for (const auto& entry : awaiting) {
    const io::SafetensorsFile& file = *owner.at(entry.first);
    const at::Tensor source = file.view(entry.first);
    io::require_finite(source, "quant", file.path(), entry.first);  // quantising would hide a NaN in a scale
    entry.second->load_awaited_weight(source);
  }
}

}  // namespace remat::models
