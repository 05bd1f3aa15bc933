// The tiny MageFlow pipeline folder of `remat make-demo-pipeline --model_family mageflow`.
#include "remat/encoders/mageflow_demo_pipeline.h"

#include <filesystem>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/encoders/mageflow_encoders.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/encoders/qwen2_tokenizer.h"
#include "remat/io/safetensors.h"
#include "remat/models/component_weights.h"
#include "remat/util/error.h"
#include "remat/util/files.h"

namespace remat::encoders {
namespace {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

at::ScalarType demo_weight_dtype(const std::string& name) {
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp32") return at::kFloat;
  throw_value_error("[pipeline] demo pipeline dtype must be bf16 or fp32, got '" + name + "'");
}

void make_demo_directory(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_value_error("[pipeline] cannot create '" + dir + "': " + ec.message());
}

void write_demo_text(const std::string& path, const std::string& text) { util::write_file_atomically(path, text, "pipeline"); }

// One diffusion_pytorch_model.safetensors: SimpleTuner's MageFlowTransformer2DModel.from_pretrained
// and the vendored load_from_repo read that file alone (remat reads sharded folders too).
void write_mageflow_transformer(const std::string& dir, const models::MageFlowConfig& config,
                                const DemoPipelineOptions& options) {
  torch::manual_seed(options.seed);
  models::MageFlow model(config);
  model->to(demo_weight_dtype(options.dtype));
  models::save_component(dir, *model, config.to_json(), models::kDefaultMaxShardBytes, "diffusion_pytorch_model");
}

void write_mageflow_vae(const std::string& dir, const models::MageFlowConfig& transformer, const DemoPipelineOptions& options) {
  const MageVaeConfig config = mageflow_demo_vae_config(transformer);
  make_demo_directory(dir);
  io::save_safetensors((fs::path(dir) / "diffusion_pytorch_model.safetensors").string(),
                       MageVae::random_checkpoint(config, options.seed + 1, 0.1, demo_weight_dtype(options.dtype)));
  write_demo_text((fs::path(dir) / "config.json").string(), config.to_json());
}

void write_mageflow_text_encoder(const std::string& dir, const models::MageFlowConfig& transformer,
                        const DemoPipelineOptions& options) {
  write_demo_qwen2_tokenizer(dir);
  const auto tokenizer = Qwen2Tokenizer::from_directory(dir);
  const Qwen3TextConfig config = mageflow_demo_text_config(transformer, tokenizer.vocab_size());
  torch::manual_seed(options.seed + 2);
  Qwen3TextModel model(config);
  std::vector<io::NamedTensor> tensors;
  const at::ScalarType dtype = demo_weight_dtype(options.dtype);
  for (const auto& item : model->named_parameters()) {
    // Qwen3-VL's initializer_range (0.02) leaves every caption's states nearly alike; wider weights
    // make the demo's captions tell apart.
    const bool norm = item.key().find("norm") != std::string::npos;
    const at::Tensor value = norm ? torch::ones(item.value().sizes()) : torch::randn(item.value().sizes()) * 0.3;
    tensors.emplace_back(std::string(kQwen3VlLanguageModelPrefix) + item.key(), value.to(dtype));
  }
  io::save_safetensors((fs::path(dir) / "model.safetensors").string(), tensors);
  write_demo_text((fs::path(dir) / "config.json").string(), qwen3_vl_config_json(config));
}

void write_mageflow_scheduler(const std::string& dir) {
  make_demo_directory(dir);
  OrderedJson j;
  j["_class_name"] = "FlowMatchEulerDiscreteScheduler";
  j["_diffusers_version"] = demo_diffusers_version();
  j["num_train_timesteps"] = 1000;
  j["shift"] = 6.0;
  j["use_dynamic_shifting"] = false;
  write_demo_text((fs::path(dir) / "scheduler_config.json").string(), j.dump(2) + "\n");
}

}  // namespace

MageVaeConfig mageflow_demo_vae_config(const models::MageFlowConfig& transformer) {
  MageVaeConfig c = MageVaeConfig::preset("mage-vae-tiny");
  c.latent_channels = transformer.in_channels;
  c.bottleneck_dim = transformer.in_channels;
  return c;
}

Qwen3TextConfig mageflow_demo_text_config(const models::MageFlowConfig& transformer, int64_t tokenizer_vocab_size) {
  Qwen3TextConfig c;
  c.vocab_size = tokenizer_vocab_size;
  c.hidden_size = transformer.context_in_dim;
  c.intermediate_size = 2 * transformer.context_in_dim;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.validate();
  return c;
}

std::string qwen3_vl_config_json(const Qwen3TextConfig& text) {
  text.validate();
  OrderedJson t;
  t["attention_bias"] = text.attention_bias;
  t["head_dim"] = text.head_dim;
  t["hidden_act"] = "silu";
  t["hidden_size"] = text.hidden_size;
  t["intermediate_size"] = text.intermediate_size;
  t["model_type"] = "qwen3_vl_text";
  t["num_attention_heads"] = text.num_attention_heads;
  t["num_hidden_layers"] = text.num_hidden_layers;
  t["num_key_value_heads"] = text.num_key_value_heads;
  t["rms_norm_eps"] = text.rms_norm_eps;
  t["rope_theta"] = text.rope_theta;
  t["vocab_size"] = text.vocab_size;
  OrderedJson j;
  j["architectures"] = OrderedJson::array({"Qwen3VLForConditionalGeneration"});
  j["model_type"] = "qwen3_vl";
  j["text_config"] = t;
  return j.dump(2) + "\n";
}

std::vector<std::string> write_mageflow_demo_pipeline(const std::string& root, const DemoPipelineOptions& options) {
  demo_weight_dtype(options.dtype);  // checked before anything is written
  const models::MageFlowConfig transformer = models::MageFlowConfig::preset(options.transformer_preset);
  if (is_pipeline_folder(root)) {
    throw_value_error("[pipeline] '" + root + "' already holds a model_index.json; choose an empty directory");
  }
  make_demo_directory(root);
  const auto in = [&](const char* name) { return (fs::path(root) / name).string(); };
  write_mageflow_scheduler(in("scheduler"));
  write_mageflow_transformer(in("transformer"), transformer, options);
  write_mageflow_vae(in("vae"), transformer, options);
  write_mageflow_text_encoder(in("text_encoder"), transformer, options);
  OrderedJson index;
  index["_class_name"] = "MageFlowPipeline";
  index["_diffusers_version"] = demo_diffusers_version();
  // Where the vendored load_from_repo finds the VAE checkpoint and the text encoder.
  index["_text_encoder_path"] = "text_encoder";
  index["_vae_source"] = "vae/diffusion_pytorch_model.safetensors";
  index["scheduler"] = OrderedJson::array({"diffusers", "FlowMatchEulerDiscreteScheduler"});
  index["text_encoder"] = OrderedJson::array({"transformers", "Qwen3VLForConditionalGeneration"});
  index["transformer"] = OrderedJson::array({"diffusers", "MageFlowTransformer2DModel"});
  index["vae"] = OrderedJson::array({"diffusers", "MageVAE"});
  write_demo_text(in("model_index.json"), index.dump(2) + "\n");
  return {"scheduler", "transformer", "vae", "text_encoder"};
}

}  // namespace remat::encoders
