// Merging a LoRA file into a model's weights, and writing remat's LoRA in kohya's Flux form.
#include <algorithm>

#include <torch/torch.h>

#include "string_helpers.h"
#include "remat/util/error.h"
#include "remat/io/safetensors.h"
#include "remat/models/flux_weight_formats.h"
#include "remat/models/layers.h"
#include "remat/models/lora_formats.h"

namespace remat::models {
namespace {

using remat::detail::ends_with;
using remat::detail::shape_text;

const char* const kLoraMergeTag = "[lora] ";


}  // namespace

void merge_lora(torch::nn::Module& model, const LoraFile& lora, double user_scale) {
  std::map<std::string, LinearImpl*> linears;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto* linear = dynamic_cast<LinearImpl*>(item.value().get())) linears[item.key()] = linear;
  }
  std::map<std::string, at::Tensor> params;
  for (const auto& item : model.named_parameters(true)) params[item.key()] = item.value();

  // 1. Check everything (a LoRA for another model shape is refused before any weight changes).
  for (const auto& [name, w] : lora.modules) {
    const auto it = linears.find(name);
    if (it == linears.end()) {
      throw_value_error(kLoraMergeTag + lora.path + ": module " + name + " (" + lora_format_name(lora.format) +
                        " LoRA) is not a Linear layer of this model (a LoRA for another model?)");
    }
    // A quantised base has no `weight` parameter; its shape is the layer's.
    const at::Tensor weight = it->second->is_quantized()
                                  ? at::empty({it->second->out_features(), it->second->in_features()}, at::kMeta)
                                  : it->second->weight;
    const bool fits = w.down.dim() == 2 && w.up.dim() == 2 && w.up.size(1) == w.down.size(0) &&
                      w.down.size(1) == weight.size(1) && w.up.size(0) == weight.size(0);
    if (!fits) {
      throw_value_error(kLoraMergeTag + lora.path + ": module " + name + " has weight " + shape_text(weight.sizes()) +
                        " but the LoRA factors are down " + shape_text(w.down.sizes()) + " and up " +
                        shape_text(w.up.sizes()) + " (a LoRA for another model shape)");
    }
  }
  for (const auto& [name, tensor] : lora.replaced_weights) {
    const auto it = params.find(name);
    if (it == params.end() || it->second.sizes() != tensor.sizes()) {
      throw_value_error(kLoraMergeTag + lora.path + ": replaced weight " + name + " " + shape_text(tensor.sizes()) +
                        (it == params.end() ? " is not a parameter of this model"
                                            : " does not fit the model's " + shape_text(it->second.sizes())));
    }
  }
  if (user_scale == 0.0) return;  // the base model, bit for bit

  // 2. Apply: W += user_scale * scale * up @ down in float32, rounded once to W's dtype.
  torch::NoGradGuard no_grad;
  for (const auto& [name, w] : lora.modules) {
    LinearImpl& linear = *linears.at(name);
    if (linear.is_quantized()) {
      // Merged into the dequantised weight in float32 and quantised again in the same format.
      const QuantizedWeight& q = linear.quantized_weight();
      const at::Tensor full = dequantize_weight(q, at::kFloat);
      const at::Tensor delta = at::matmul(w.up.to(full.device(), at::kFloat), w.down.to(full.device(), at::kFloat)) *
                               (user_scale * w.scale);
      linear.set_quantized_weight(quantize_weight(full + delta, q.mode, q.scale_scales.defined()));
      continue;
    }
    // One transient (out, in) float32 matrix per module: the product is scaled and summed in place
    // (a float32 weight takes the delta directly; another dtype goes through one float32 copy).
    at::Tensor& weight = linear.weight;
    at::Tensor delta = at::matmul(w.up.to(weight.device(), at::kFloat), w.down.to(weight.device(), at::kFloat));
    delta.mul_(user_scale * w.scale);
    if (weight.scalar_type() == at::kFloat) {
      weight.add_(delta);
    } else {
      weight.copy_(delta.add_(weight));
    }
  }
  for (const auto& [name, tensor] : lora.replaced_weights) params.at(name).copy_(tensor);
}

void save_lora_kohya(const std::string& path, const std::map<std::string, at::Tensor>& peft_state_dict, double alpha,
                     const std::map<std::string, std::string>& metadata) {
  if (!(alpha > 0)) throw_value_error(std::string(kLoraMergeTag) + "kohya export of " + path + ": alpha must be > 0");
  // Collect the adapters by diffusers module name.
  struct Factors {
    at::Tensor down, up;
  };
  std::map<std::string, Factors> modules;
  for (const auto& [key, tensor] : peft_state_dict) {
    std::string k = key.rfind("transformer.", 0) == 0 ? key.substr(12) : key;
    if (ends_with(k, ".lora_A.weight")) {
      modules[k.substr(0, k.size() - 14)].down = tensor.detach().to(at::kCPU, at::kFloat);
    } else if (ends_with(k, ".lora_B.weight")) {
      modules[k.substr(0, k.size() - 14)].up = tensor.detach().to(at::kCPU, at::kFloat);
    } else {
      throw_value_error(std::string(kLoraMergeTag) + "kohya export of " + path + ": key " + key +
                        " is not a PEFT LoRA factor (transformer.<module>.lora_A.weight / .lora_B.weight)");
    }
  }
  // Group them by BFL module (fused layers gather their parts).
  std::map<std::string, std::pair<BflModule, std::map<size_t, Factors>>> groups;
  for (const auto& [module, f] : modules) {
    if (!f.down.defined() || !f.up.defined() || f.down.dim() != 2 || f.up.dim() != 2 || f.up.size(1) != f.down.size(0)) {
      throw_value_error(std::string(kLoraMergeTag) + "kohya export of " + path + ": module " + module +
                        " needs lora_A (r, in) and lora_B (out, r)");
    }
    const auto slot = find_bfl_module_of(module);
    if (!slot) {
      throw_value_error(std::string(kLoraMergeTag) + "kohya export of " + path + ": module " + module +
                        " has no Black Forest Labs name (not a Flux Linear layer)");
    }
    auto& group = groups[slot->module.bfl];
    group.first = slot->module;
    group.second[slot->part] = f;
  }
  std::vector<io::NamedTensor> entries;
  for (const auto& [bfl, group] : groups) {
    const auto& [module, parts] = group;
    std::string name = "lora_unet_" + bfl;
    std::replace(name.begin(), name.end(), '.', '_');
    const auto alpha_tensor = [](double a) { return at::full({}, a, at::kFloat); };
    const Factors& first = parts.begin()->second;
    const int64_t rank = first.down.size(0);
    if (module.diffusers.size() == 1) {
      if (module.pattern->bfl.rfind("final_layer", 0) == 0) {
        // diffusers reads the final layer without alpha, with lora_B's halves swapped: bake
        // alpha / r into lora_up and write alpha = r so every reader gets the same delta.
        const at::Tensor up = first.up * (alpha / static_cast<double>(rank));
        entries.emplace_back(name + ".lora_down.weight", first.down);
        entries.emplace_back(name + ".lora_up.weight",
                             module.pattern->swap_halves ? at::cat({up.chunk(2, 0)[1], up.chunk(2, 0)[0]}, 0) : up);
        entries.emplace_back(name + ".alpha", alpha_tensor(static_cast<double>(rank)));
      } else {
        entries.emplace_back(name + ".lora_down.weight", first.down);
        entries.emplace_back(name + ".lora_up.weight", first.up);
        entries.emplace_back(name + ".alpha", alpha_tensor(alpha));
      }
      continue;
    }
    // Fused layer: one block-diagonal adapter of rank n r and alpha n alpha (same alpha / rank).
    // A part without an adapter gets zero factors, so the blocks stay the same size and a
    // reader sees the diagonal structure (and a zero delta for that part).
    const size_t n = module.diffusers.size();
    const int64_t in_features = first.down.size(1);
    // The hidden size from the first part present: its rows are split_units of it.
    const int64_t hidden = first.up.size(0) / module.pattern->split_units[parts.begin()->first];
    std::vector<at::Tensor> downs, ups_rows;
    for (size_t j = 0; j < n; ++j) {
      const int64_t rows = module.pattern->split_units[j] * hidden;
      const auto it = parts.find(j);
      if (it != parts.end() && (it->second.down.size(0) != rank || it->second.down.size(1) != in_features ||
                                it->second.up.size(0) != rows)) {
        throw_value_error(std::string(kLoraMergeTag) + "kohya export of " + path + ": the parts of " + bfl +
                          " must share rank and input size to form one block-diagonal adapter (" +
                          module.diffusers[j] + " has down " + shape_text(it->second.down.sizes()) + ")");
      }
      const at::Tensor down = it != parts.end() ? it->second.down : at::zeros({rank, in_features});
      const at::Tensor up = it != parts.end() ? it->second.up : at::zeros({rows, rank});
      downs.push_back(down);
      at::Tensor row_block = at::zeros({rows, static_cast<int64_t>(n) * rank});
      row_block.narrow(1, static_cast<int64_t>(j) * rank, rank).copy_(up);
      ups_rows.push_back(row_block);
    }
    entries.emplace_back(name + ".lora_down.weight", at::cat(downs, 0));
    entries.emplace_back(name + ".lora_up.weight", at::cat(ups_rows, 0));
    entries.emplace_back(name + ".alpha", alpha_tensor(static_cast<double>(n) * alpha));
  }
  std::map<std::string, std::string> meta = metadata;
  meta.emplace("format", "pt");
  io::save_safetensors(path, entries, meta);
}

}  // namespace remat::models
