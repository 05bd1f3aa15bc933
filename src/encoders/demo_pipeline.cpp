// The tiny Flux pipeline folder of `remat make-demo-pipeline`: one writer per component.
#include "remat/encoders/demo_pipeline.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/encoders/pipeline_folder.h"
#include "remat/util/error.h"
#include "remat/util/files.h"
#include "remat/io/safetensors.h"

namespace remat::encoders {
namespace {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

// The diffusers version the written files claim to come from: the one whose sources the layout
// was checked against (diffusers commit 58eb52c0803ea9af3abec60841c2a093bdf1f951).
const char* const kDiffusersVersion = "0.40.0.dev0";

at::ScalarType dtype_of(const std::string& name) {
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp32") return at::kFloat;
  throw_value_error("[pipeline] demo pipeline dtype must be bf16 or fp32, got '" + name + "'");
}

}  // namespace

const char* demo_diffusers_version() { return kDiffusersVersion; }

std::string flux_transformer_config_json(const models::FluxConfig& config) {
  config.validate();
  OrderedJson j;
  j["_class_name"] = "FluxTransformer2DModel";
  j["_diffusers_version"] = kDiffusersVersion;
  j["attention_head_dim"] = config.attention_head_dim;
  j["axes_dims_rope"] = config.axes_dims_rope;
  j["guidance_embeds"] = config.guidance_embeds;
  j["in_channels"] = config.in_channels;
  j["joint_attention_dim"] = config.joint_attention_dim;
  j["num_attention_heads"] = config.num_attention_heads;
  j["num_layers"] = config.num_layers;
  j["num_single_layers"] = config.num_single_layers;
  j["out_channels"] = config.out_channels ? OrderedJson(*config.out_channels) : OrderedJson(nullptr);
  j["patch_size"] = config.patch_size;
  j["pooled_projection_dim"] = config.pooled_projection_dim;
  return j.dump(2) + "\n";
}

std::string flux_dev_scheduler_config_json() {
  OrderedJson j;
  j["_class_name"] = "FlowMatchEulerDiscreteScheduler";
  j["_diffusers_version"] = kDiffusersVersion;
  j["base_image_seq_len"] = 256;
  j["base_shift"] = 0.5;
  j["max_image_seq_len"] = 4096;
  j["max_shift"] = 1.15;
  j["num_train_timesteps"] = 1000;
  j["shift"] = 3.0;
  j["use_dynamic_shifting"] = true;
  return j.dump(2) + "\n";
}

void write_demo_transformer(const std::string& component_dir, const DemoPipelineOptions& options) {
  if (options.transformer_shards < 1) {
    throw_value_error("[pipeline] demo transformer shards must be >= 1, got " +
                      std::to_string(options.transformer_shards));
  }
  const auto config = models::FluxConfig::preset(options.transformer_preset);
  torch::manual_seed(options.seed);
  models::Flux model(config);
  model->to(dtype_of(options.dtype));
  uint64_t total = 0, largest = 0;
  for (const auto& [name, tensor] : io::module_state(*model)) {
    const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
    total += bytes;
    largest = std::max(largest, bytes);
  }
  // A limit of total / shards (at least the largest tensor) cuts the state dict into about
  // `shards` files under the hub's rule.
  const uint64_t limit = options.transformer_shards == 1
                             ? total
                             : std::max(largest, total / static_cast<uint64_t>(options.transformer_shards) + 1);
  models::save_component(component_dir, *model, flux_transformer_config_json(config), limit, "diffusion_pytorch_model");
}

void write_demo_scheduler(const std::string& component_dir, const DemoPipelineOptions&) {
  std::error_code ec;
  fs::create_directories(component_dir, ec);
  if (ec) throw_value_error("[pipeline] cannot create '" + component_dir + "': " + ec.message());
  util::write_file_atomically((fs::path(component_dir) / "scheduler_config.json").string(),
                             flux_dev_scheduler_config_json(), "pipeline");
}

std::vector<DemoComponentWriter> demo_pipeline_components() {
  return {
      {"scheduler", "diffusers", "FlowMatchEulerDiscreteScheduler", write_demo_scheduler},
      {"transformer", "diffusers", "FluxTransformer2DModel", write_demo_transformer},
      {"vae", "diffusers", "AutoencoderKL", write_demo_vae},
      {"tokenizer", "transformers", "CLIPTokenizer", write_demo_tokenizer},
      {"text_encoder", "transformers", "CLIPTextModel", write_demo_text_encoder},
      // tokenizer_2 before text_encoder_2: T5's embedding is sized to the trained tokenizer.
      {"tokenizer_2", "transformers", "T5TokenizerFast", write_demo_tokenizer_2},
      {"text_encoder_2", "transformers", "T5EncoderModel", write_demo_text_encoder_2},
  };
}

std::vector<std::string> write_demo_pipeline(const std::string& root, const DemoPipelineOptions& options) {
  dtype_of(options.dtype);  // checked before anything is written
  if (is_pipeline_folder(root)) {
    throw_value_error("[pipeline] '" + root + "' already holds a model_index.json; choose an empty directory");
  }
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw_value_error("[pipeline] cannot create '" + root + "': " + ec.message());
  OrderedJson index;
  index["_class_name"] = "FluxPipeline";
  index["_diffusers_version"] = kDiffusersVersion;
  std::map<std::string, OrderedJson> entries;
  for (const auto& name : flux_pipeline_components()) entries[name] = OrderedJson::array({nullptr, nullptr});
  std::vector<std::string> written;
  for (const auto& component : demo_pipeline_components()) {
    component.write((fs::path(root) / component.name).string(), options);
    entries[component.name] = OrderedJson::array({component.library, component.class_name});
    written.push_back(component.name);
  }
  // diffusers writes the components in alphabetical order, after the underscore keys.
  for (const auto& [name, value] : entries) index[name] = value;
  util::write_file_atomically((fs::path(root) / "model_index.json").string(), index.dump(2) + "\n", "pipeline");
  return written;
}

}  // namespace remat::encoders
