// Detecting Black Forest Labs' Flux layout, inferring a config from it, loading it tensor by
// tensor from the file mapping, and writing a model in it.
#include <algorithm>
#include <filesystem>
#include <set>

#include <torch/torch.h>

#include "string_helpers.h"
#include "remat/util/error.h"
#include "remat/models/flux_weight_formats.h"
#include "remat/models/layers.h"
#include "remat/models/quantized_loading.h"
#include "quantized_build.h"

namespace remat::models {
namespace {

using remat::detail::shape_text;

const char* const kWeightsTag = "[flux weights] ";
const std::string kBflFilePrefix = "model.diffusion_model.";

bool is_lora_factor(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

// Linears built under DeferLinearWeights that wait for a weight to quantise, by their weight's key.
std::map<std::string, LinearImpl*> awaiting_linears(const torch::nn::Module& model) {
  std::map<std::string, LinearImpl*> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    if (linear != nullptr && linear->awaits_weight()) out[item.key() + ".weight"] = linear;
  }
  return out;
}

// The model's parameters and buffers by diffusers name, without LoRA factors. A Linear waiting
// for a weight to quantise appears as a meta tensor of its weight's shape (no storage): checked
// like any parameter, then quantised as it streams by (store_tensor).
std::map<std::string, at::Tensor> model_tensors(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, linear] : awaiting_linears(model)) {
    out[key] = at::empty({linear->out_features(), linear->in_features()}, at::TensorOptions().device(at::kMeta));
  }
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!is_lora_factor(item.key())) out[item.key()] = item.value();
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) out[item.key()] = item.value();
  return out;
}


// The shape a BFL tensor must have for `t`: the targets' shapes stacked along dim 0.
std::vector<int64_t> expected_bfl_shape(const BflTensor& t, const std::map<std::string, at::Tensor>& params) {
  std::vector<int64_t> shape = params.at(t.diffusers_keys[0]).sizes().vec();
  for (size_t j = 1; j < t.diffusers_keys.size(); ++j) shape[0] += params.at(t.diffusers_keys[j]).size(0);
  return shape;
}

int64_t max_block_index(const std::vector<std::string>& keys, const std::string& head) {
  int64_t best = -1;
  for (const auto& k : keys) {
    if (k.rfind(head, 0) != 0) continue;
    const size_t end = k.find('.', head.size());
    const std::string digits = k.substr(head.size(), end - head.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    best = std::max<int64_t>(best, std::stoll(digits));
  }
  return best;
}

// Stores `source` (a view into the mapping, or a slice of one) as the model tensor `key`: copied
// into a parameter, or quantised into a waiting Linear (a meta placeholder in `params`).
void store_tensor(const std::string& key, const at::Tensor& source, const std::map<std::string, at::Tensor>& params,
                  const std::map<std::string, LinearImpl*>& awaiting) {
  const auto it = awaiting.find(key);
  if (it != awaiting.end()) {
    it->second->load_awaited_weight(source);
    return;
  }
  params.at(key).copy_(source);
}

// Copies the BFL tensor `source` (a view into the mapping) into its diffusers targets.
void copy_bfl_tensor(const BflTensor& t, const at::Tensor& source, const std::map<std::string, at::Tensor>& params,
                     const std::map<std::string, LinearImpl*>& awaiting) {
  if (t.swap_halves) {
    const int64_t half = source.size(0) / 2;
    const std::string& key = t.diffusers_keys[0];
    if (awaiting.count(key)) {
      // One full tensor in the file's dtype: the halves in diffusers' order, then quantised.
      store_tensor(key, at::cat({source.narrow(0, half, half), source.narrow(0, 0, half)}), params, awaiting);
      return;
    }
    at::Tensor dest = params.at(key);
    dest.narrow(0, 0, half).copy_(source.narrow(0, half, half));
    dest.narrow(0, half, half).copy_(source.narrow(0, 0, half));
    return;
  }
  int64_t offset = 0;
  for (const auto& key : t.diffusers_keys) {
    const int64_t rows = params.at(key).size(0);
    store_tensor(key, source.narrow(0, offset, rows), params, awaiting);
    offset += rows;
  }
}

}  // namespace

FluxWeightLayoutInfo detect_flux_weight_layout(const std::vector<std::string>& keys) {
  const std::set<std::string> present(keys.begin(), keys.end());
  for (const std::string& prefix : {std::string(), std::string(kBflFilePrefix)}) {
    for (const char* marker : {"img_in.weight", "double_blocks.0.img_attn.norm.key_norm.scale"}) {
      if (present.count(prefix + marker)) return {FluxWeightLayout::bfl, prefix};
    }
  }
  return {FluxWeightLayout::diffusers, ""};
}

bool is_bfl_flux_file(const std::string& safetensors_file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(safetensors_file, ec)) return false;
  try {
    const auto file = io::SafetensorsFile::open(safetensors_file);
    return detect_flux_weight_layout(file.names()).layout == FluxWeightLayout::bfl;
  } catch (const c10::Error&) {
    return false;  // not ours to judge: the loader reports the file's problem with its own message
  }
}

FluxConfig flux_config_from_bfl(const io::SafetensorsFile& file) {
  const auto layout = detect_flux_weight_layout(file.names());
  if (layout.layout != FluxWeightLayout::bfl) {
    throw_value_error(std::string(kWeightsTag) + file.path() + " is not in Black Forest Labs' layout (no img_in.weight)");
  }
  std::vector<std::string> keys;
  for (const auto& k : file.names()) {
    if (k.rfind(layout.prefix, 0) == 0) keys.push_back(k.substr(layout.prefix.size()));
  }
  const auto shape_of = [&](const std::string& key, size_t dims) {
    const std::string full = layout.prefix + key;
    if (!file.contains(full)) {
      throw_value_error(std::string(kWeightsTag) + file.path() + ": cannot infer the Flux config without " + full +
                        " (give a config.json)");
    }
    const auto& shape = file.info(full).shape;
    if (shape.size() != dims) {
      throw_value_error(std::string(kWeightsTag) + file.path() + ": " + full + " must have " + std::to_string(dims) +
                        " dimensions, has shape " + shape_text(shape));
    }
    return shape;
  };
  FluxConfig config;
  const auto img_in = shape_of("img_in.weight", 2);
  const int64_t hidden = img_in[0];
  config.in_channels = img_in[1];
  config.joint_attention_dim = shape_of("txt_in.weight", 2)[1];
  config.pooled_projection_dim = shape_of("vector_in.in_layer.weight", 2)[1];
  const int64_t out_channels = shape_of("final_layer.linear.weight", 2)[0];
  if (out_channels != config.in_channels) config.out_channels = out_channels;
  config.guidance_embeds = file.contains(layout.prefix + "guidance_in.in_layer.weight");
  config.num_layers = max_block_index(keys, "double_blocks.") + 1;
  config.num_single_layers = max_block_index(keys, "single_blocks.") + 1;
  const std::string norm_key = config.num_layers > 0 ? "double_blocks.0.img_attn.norm.query_norm.scale"
                                                     : "single_blocks.0.norm.query_norm.scale";
  config.attention_head_dim = shape_of(norm_key, 1)[0];
  if (config.attention_head_dim < 1 || hidden % config.attention_head_dim != 0) {
    throw_value_error(std::string(kWeightsTag) + file.path() + ": hidden size " + std::to_string(hidden) +
                      " (img_in rows) is not a multiple of the head size " +
                      std::to_string(config.attention_head_dim) + " (query norm)");
  }
  config.num_attention_heads = hidden / config.attention_head_dim;
  bool rope_found = false;
  for (const auto& name : FluxConfig::preset_names()) {
    const auto preset = FluxConfig::preset(name);
    if (preset.attention_head_dim == config.attention_head_dim) {
      config.axes_dims_rope = preset.axes_dims_rope;
      rope_found = true;
      break;
    }
  }
  if (!rope_found) {
    throw_value_error(std::string(kWeightsTag) + file.path() + ": head size " + std::to_string(config.attention_head_dim) +
                      " matches no preset (128, 64, 32), so axes_dims_rope is unknown; give a config.json");
  }
  config.validate();
  return config;
}

void load_flux_weights(FluxImpl& model, const std::vector<io::SafetensorsFile>& files) {
  std::vector<std::string> all_keys;
  std::map<std::string, const io::SafetensorsFile*> owner;  // file key -> its file
  for (const auto& f : files) {
    for (const auto& k : f.names()) {
      if (!owner.emplace(k, &f).second) {
        throw_value_error(std::string(kWeightsTag) + "key " + k + " is in both " + owner[k]->path() + " and " + f.path());
      }
      all_keys.push_back(k);
    }
  }
  const auto layout = detect_flux_weight_layout(all_keys);
  const auto awaiting = awaiting_linears(model);
  if (layout.layout == FluxWeightLayout::diffusers) {
    // Strict: names every missing/unexpected key; quantises waiting Linears as they stream by.
    load_state_dict_quantizing(model, files);
    return;
  }
  const std::string where = files.size() == 1 ? files[0].path() : files[0].path() + " (and its shards)";
  const auto params = model_tensors(model);
  const auto table = flux_bfl_tensors(model.config());

  // 1. Everything is checked before anything is copied: the model stays untouched on error.
  std::set<std::string> covered;
  for (const auto& t : table) {
    for (const auto& d : t.diffusers_keys) {
      if (!params.count(d)) {
        throw_value_error(std::string(kWeightsTag) + "the model has no parameter " + d + " (table row " + t.bfl_key + ")");
      }
      covered.insert(d);
    }
  }
  for (const auto& [name, tensor] : params) {
    if (!covered.count(name)) {
      throw_value_error(std::string(kWeightsTag) + "model parameter " + name + " has no row in the BFL table");
    }
  }
  std::set<std::string> consumed;
  for (const auto& t : table) {
    const std::string key = layout.prefix + t.bfl_key;
    const auto found = owner.find(key);
    if (found == owner.end()) {
      throw_value_error(std::string(kWeightsTag) + where + " (Black Forest Labs layout) has no " + key +
                        ", which a Flux model with " + std::to_string(model.config().num_layers) + " double and " +
                        std::to_string(model.config().num_single_layers) + " single blocks needs");
    }
    const auto& info = found->second->info(key);
    const auto expected = expected_bfl_shape(t, params);
    if (info.shape != expected) {
      throw_value_error(std::string(kWeightsTag) + where + ": " + key + " has shape " + shape_text(info.shape) +
                        ", the model needs " + shape_text(expected) + " (a checkpoint for another model shape?)");
    }
    if (!at::isFloatingType(info.dtype)) {
      throw_value_error(std::string(kWeightsTag) + where + ": " + key + " must be a floating tensor, is " +
                        std::string(c10::toString(info.dtype)));
    }
    consumed.insert(key);
  }
  for (const auto& k : all_keys) {
    if (!consumed.count(k)) {
      throw_value_error(std::string(kWeightsTag) + where + ": key " + k +
                        " is not part of a Flux transformer with this config (BFL layout; every key must be used)");
    }
  }

  // 2. Stream: one zero-copy view at a time, its rows copied straight into the parameters.
  torch::NoGradGuard no_grad;
  for (const auto& t : table) {
    const std::string key = layout.prefix + t.bfl_key;
    const at::Tensor source = owner.at(key)->view(key);
    io::require_finite(source, "flux", owner.at(key)->path(), key);
    copy_bfl_tensor(t, source, params, awaiting);
  }
}

void load_flux_weights(FluxImpl& model, const std::string& safetensors_file) {
  load_flux_weights(model, std::vector<io::SafetensorsFile>{io::SafetensorsFile::open(safetensors_file)});
}

void save_flux_bfl(const std::string& path, const FluxImpl& model, const std::map<std::string, std::string>& metadata) {
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const auto* linear = dynamic_cast<const LinearImpl*>(item.value().get());
    if (linear != nullptr && (linear->is_quantized() || linear->is_deferred())) {
      throw_value_error(std::string(kWeightsTag) + "cannot save " + path + ": " + item.key() +
                        " holds a quantised (or not yet loaded) weight; save the full-precision model");
    }
  }
  const auto params = model_tensors(model);
  std::vector<io::NamedTensor> entries;
  for (const auto& t : flux_bfl_tensors(model.config())) {
    std::vector<at::Tensor> parts;
    for (const auto& d : t.diffusers_keys) parts.push_back(params.at(d).detach());
    at::Tensor out;
    if (t.swap_halves) {
      const auto halves = parts[0].chunk(2, 0);
      out = at::cat({halves[1], halves[0]}, 0);  // diffusers (scale, shift) -> BFL (shift, scale)
    } else {
      out = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
    }
    entries.emplace_back(t.bfl_key, out);
  }
  io::save_safetensors(path, entries, metadata);
}

Flux make_quantized_flux(const FluxConfig& config, const BasePrecision& precision,
                         const std::vector<io::SafetensorsFile>* files) {
  return make_quantized_model<Flux>(config, precision, files,
                                      [](FluxImpl& m, const std::vector<io::SafetensorsFile>& f) { load_flux_weights(m, f); });
}

}  // namespace remat::models
