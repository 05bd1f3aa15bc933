// The family-independent parts of remat::train::Transformer, and the helpers the families'
// adapters share (transformer_support.h). Each family's adapter lives in families/<name>.cpp.
#include "remat/train/family/transformer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "remat/encoders/pipeline_folder.h"
#include "remat/util/error.h"
#include "remat/io/safetensors.h"
#include "remat/models/layers.h"
#include "remat/models/lora.h"
#include "remat/train/family/family.h"
#include "family/transformer_support.h"

namespace remat::train {
namespace support {


SigmaSampling sampling_of(const FlowMatchingOptions& options) {
  return options.uniform ? SigmaSampling::Uniform : SigmaSampling::LogitNormal;
}

bool any_requires_grad(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) return true;
  }
  return false;
}

std::vector<at::Tensor> trainable(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

void load_weights(torch::nn::Module& module, const std::optional<std::string>& weights, const std::string& variant) {
  if (!weights) return;
  std::error_code ec;
  if (std::filesystem::is_directory(*weights, ec)) {
    // A component folder: one file or shards with an index (remat/encoders/pipeline_folder.h).
    models::load_component(*weights, module, {}, variant);  // strict: names each key and its file
    return;
  }
  io::load_state_dict_into(module, *weights);  // strict: names every missing/unexpected key
}

std::vector<io::SafetensorsFile> open_weight_files(const std::string& weights, const std::string& variant) {
  std::error_code ec;
  if (std::filesystem::is_directory(weights, ec)) return models::open_component_weights(weights, variant);
  std::vector<io::SafetensorsFile> files;
  files.push_back(io::SafetensorsFile::open(weights));
  return files;
}

// Shared by the families' synthetic_batch: counts must be >= 1.
void check_synthetic_counts(const std::string& family, int64_t batch, int64_t image_tokens,
                            int64_t text_tokens) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"batch", batch},
                                    {"image_tokens", image_tokens},
                                    {"text_tokens", text_tokens}}) {
    if (value < 1) {
      throw_value_error("[" + family + "] " + name + " must be >= 1, got " +
                                  std::to_string(value));
    }
  }
}

// Rows of the most square rows x cols grid with rows * cols = tokens (rows <= cols).
int64_t squarest_rows(int64_t tokens) {
  int64_t rows = static_cast<int64_t>(std::sqrt(static_cast<double>(tokens)));
  while (rows > 1 && tokens % rows != 0) --rows;
  return rows;
}

// Checks that `inputs` holds exactly `expected` (every name missing or unexpected is listed) with
// floating dtypes; returns an accessor giving each as float32.
std::function<at::Tensor(const std::string&)> check_named_inputs(
    const std::map<std::string, at::Tensor>& inputs, const std::vector<std::string>& expected,
    const std::string& family, const std::vector<std::string>& integer_inputs) {
  std::vector<std::string> missing, unexpected;
  for (const auto& name : expected) {
    if (inputs.count(name) == 0) missing.push_back(name);
  }
  for (const auto& [name, tensor] : inputs) {
    if (std::find(expected.begin(), expected.end(), name) == expected.end()) unexpected.push_back(name);
  }
  const auto join = [](const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
    return out;
  };
  TORCH_CHECK_VALUE(missing.empty() && unexpected.empty(), "[", family, "] inputs must be exactly {",
                    join(expected), "}", missing.empty() ? "" : "; missing: " + join(missing),
                    unexpected.empty() ? "" : "; unexpected: " + join(unexpected));
  for (const auto& [name, tensor] : inputs) {
    const bool integer = std::find(integer_inputs.begin(), integer_inputs.end(), name) != integer_inputs.end();
    if (integer) {
      TORCH_CHECK_VALUE(at::isIntegralType(tensor.scalar_type(), /*includeBool=*/false), "[", family,
                        "] input ", name, " must be an integer tensor (I32, I64), got ",
                        tensor.scalar_type());
    } else {
      TORCH_CHECK_VALUE(at::isFloatingType(tensor.scalar_type()), "[", family, "] input ", name,
                        " must be a floating tensor (F32, F16, BF16, F64), got ", tensor.scalar_type());
    }
  }
  return [&inputs, integer_inputs](const std::string& name) {
    const bool integer = std::find(integer_inputs.begin(), integer_inputs.end(), name) != integer_inputs.end();
    return integer ? inputs.at(name) : inputs.at(name).to(at::kFloat);
  };
}

}  // namespace support

std::unique_ptr<sample::Denoiser> Transformer::denoiser(const sample::FlowMatchSchedulerConfig&) {
  const ModelFamily& descriptor = model_family(family());
  throw_value_error("[sample] model_family '" + descriptor.name + "' (" + descriptor.display_name +
                    ") has no sampler in remat: it trains from latent caches, but cannot render pictures");
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::trainable_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module().named_parameters()) {
    if (item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  }
  return out;
}

int64_t Transformer::set_block_swap(int64_t blocks_to_swap, const at::Device&) {
  if (blocks_to_swap == 0) return 0;
  std::string with;
  for (const auto& name : model_family_names()) {
    if (model_family(name).checkpointing.block_swap) with += (with.empty() ? "" : ", ") + name;
  }
  throw_value_error("[train] musubi_blocks_to_swap is not supported for model family " + family() +
                    " (families with block swap: " + with + "), got " + std::to_string(blocks_to_swap));
}

void Transformer::set_attention_offload(const std::optional<SavedTensorOffload>& offload) {
  if (!offload) return;
  std::string with;
  for (const auto& name : model_family_names()) {
    if (model_family(name).checkpointing.attention_offload) with += (with.empty() ? "" : ", ") + name;
  }
  throw_value_error("[train] gradient_checkpointing_offload_attention is not supported for model family " +
                    family() + " (families with a clean attention/FFN boundary: " + with + ")");
}

std::vector<std::string> Transformer::apply_lora(const std::string& target_preset, int64_t rank,
                                                 double alpha) {
  const ModelFamily& descriptor = model_family(family());
  const auto& presets = descriptor.lora_target_presets;
  if (std::find(presets.begin(), presets.end(), target_preset) == presets.end()) {
    std::string valid;
    for (const auto& p : presets) valid += (valid.empty() ? "" : ", ") + p;
    throw_value_error("[lora] " + family() + " target preset must be one of " + valid + ", got '" +
                      target_preset + "'");
  }
  return models::apply_lora(module(), descriptor.lora_target_modules(target_preset), rank, alpha);
}

namespace {

bool has_quantized_linear(torch::nn::Module& module) {
  for (const auto& m : module.modules()) {
    const auto* linear = dynamic_cast<const models::LinearImpl*>(m.get());
    if (linear != nullptr && linear->is_quantized()) return true;
  }
  return false;
}

}  // namespace

std::unique_ptr<Transformer> make_transformer(const TransformerSpec& spec, const at::Device& device) {
  const ModelFamily& family = model_family(spec.family);
  TransformerSpec resolved = spec;
  if (resolved.flavour.empty()) resolved.flavour = family.small_flavour;
  auto model = family.build(resolved, device);
  // Flux and MageFlow build their base quantised without the float32 model
  // (remat/models/quantized_loading.h). A family that builds it in full is quantised here, layer
  // by layer, each full weight released as its quantised copy is made.
  if (resolved.base_precision.mode != models::WeightQuantization::none && !has_quantized_linear(model->module())) {
    models::quantize_linear_layers(model->module(), resolved.base_precision);
  }
  return model;
}

Batch batch_to(const Batch& batch, const at::Device& device) {
  Batch out = batch;
  const auto move = [&](const at::Tensor& t) {
    return t.defined() ? t.to(device, at::kFloat) : t;
  };
  out.latents = move(batch.latents);
  out.prompt_embeds = move(batch.prompt_embeds);
  out.pooled_prompt_embeds = move(batch.pooled_prompt_embeds);
  out.conditioning_latents = move(batch.conditioning_latents);
  return out;
}

std::pair<at::Tensor, at::Tensor> flow_matching_pair(const at::Tensor& x0, const at::Tensor& noise,
                                                     const at::Tensor& sigmas) {
  TORCH_CHECK_VALUE(sigmas.dim() == 1 && sigmas.size(0) == x0.size(0),
                    "[flow matching] sigmas must be (B) with B = ", x0.size(0), ", got shape ",
                    sigmas.sizes());
  std::vector<int64_t> shape(x0.dim(), 1);
  shape[0] = x0.size(0);
  const at::Tensor s = sigmas.view(shape).to(x0.scalar_type());
  return {(1 - s) * x0 + s * noise, noise - x0};
}

}  // namespace remat::train
