// The encoder components of the tiny demo pipeline (remat/encoders/demo_pipeline.h): a VAE, CLIP
// and T5 text encoders with random weights and their tokenizers, shaped to fit the demo
// transformer (latent channels, joint_attention_dim, pooled_projection_dim), so a picture and a
// caption encoded with them train that transformer as they are.
#include <filesystem>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/encoders/autoencoder_kl.h"
#include "remat/encoders/clip_text_model.h"
#include "remat/encoders/clip_tokenizer.h"
#include "remat/encoders/demo_pipeline.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/encoders/t5_encoder.h"
#include "remat/encoders/t5_tokenizer.h"
#include "remat/util/error.h"
#include "remat/util/files.h"

namespace remat::encoders {
namespace {

namespace fs = std::filesystem;

at::ScalarType file_dtype(const DemoPipelineOptions& options) {
  return options.dtype == "fp32" ? at::kFloat : at::kBFloat16;
}

models::FluxConfig transformer_config(const DemoPipelineOptions& options) {
  return models::FluxConfig::preset(options.transformer_preset);
}

// Each component gets its own seed stream, so adding one never changes another's weights.
void seed_for(const DemoPipelineOptions& options, uint64_t component) {
  torch::manual_seed(options.seed * 1000003 + component);
}

void create_directory(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_value_error("[pipeline] cannot create '" + dir + "': " + ec.message());
}

}  // namespace

AutoencoderKLConfig demo_vae_config(const models::FluxConfig& transformer) {
  auto config = AutoencoderKLConfig::tiny();
  // Flux packs 2 x 2 latent patches into one token of in_channels features.
  config.latent_channels = transformer.in_channels / 4;
  return config;
}

ClipTextConfig demo_clip_config(const models::FluxConfig& transformer) {
  auto config = ClipTextConfig::tiny();
  config.hidden_size = transformer.pooled_projection_dim;  // the pooled output is the transformer's
  config.intermediate_size = 2 * config.hidden_size;
  config.projection_dim = config.hidden_size;
  return config;
}

T5Config demo_t5_config(const models::FluxConfig& transformer, int64_t tokenizer_vocab_size) {
  auto config = T5Config::tiny();
  config.d_model = transformer.joint_attention_dim;  // prompt_embeds are the transformer's context
  config.vocab_size = tokenizer_vocab_size;
  return config;
}

// A trained VAE's posterior is nearly deterministic: its standard deviation is tiny next to the
// latents' spread, so a cached sample is essentially the picture's mean latent. Random weights give
// log-variances near 0 instead, noise as large as the signal, and a demo trained on such latents
// learns mostly noise. The log-variance half of the encoder's output is therefore fixed at -12
// (standard deviation e^-6, about 0.0025) in the layer that emits the moments (quant_conv when the
// VAE has one, else the encoder's conv_out); the mean half stays random.
void make_posterior_nearly_deterministic(AutoencoderKLImpl& vae, const AutoencoderKLConfig& config) {
  torch::NoGradGuard no_grad;
  const int64_t c = config.latent_channels;
  auto& moments = config.use_quant_conv ? vae.quant_conv : vae.encoder->conv_out;
  moments->weight.slice(0, c, 2 * c).zero_();
  moments->bias.slice(0, c, 2 * c).fill_(-12.0);
}

void write_demo_vae(const std::string& dir, const DemoPipelineOptions& options) {
  const auto config = demo_vae_config(transformer_config(options));
  seed_for(options, 1);
  AutoencoderKL vae(config);
  make_posterior_nearly_deterministic(*vae, config);
  vae->to(file_dtype(options));
  models::save_component(dir, *vae, config.to_json());
}

void write_demo_text_encoder(const std::string& dir, const DemoPipelineOptions& options) {
  const auto config = demo_clip_config(transformer_config(options));
  seed_for(options, 2);
  ClipTextModel clip(config);
  clip->to(file_dtype(options));
  models::save_component(dir, *clip, config.to_json(), models::kDefaultMaxShardBytes, "model");
}

void write_demo_tokenizer(const std::string& dir, const DemoPipelineOptions&) {
  create_directory(dir);
  write_tiny_clip_tokenizer(dir);
}

void write_demo_tokenizer_2(const std::string& dir, const DemoPipelineOptions&) {
  create_directory(dir);
  train_tiny_spiece_model((fs::path(dir) / "spiece.model").string());
  nlohmann::ordered_json config = {{"tokenizer_class", "T5Tokenizer"}, {"model_max_length", 512},
                                   {"eos_token", "</s>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"},
                                   {"extra_ids", 100}};
  util::write_file_atomically((fs::path(dir) / "tokenizer_config.json").string(), config.dump(2) + "\n", "pipeline");
  nlohmann::ordered_json special = {{"eos_token", "</s>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"}};
  util::write_file_atomically((fs::path(dir) / "special_tokens_map.json").string(), special.dump(2) + "\n",
                             "pipeline");
}

void write_demo_text_encoder_2(const std::string& dir, const DemoPipelineOptions& options) {
  // The embedding covers the tokenizer written beside it (pieces + T5's 100 extra ids).
  const auto tokenizer_dir = fs::path(dir).parent_path() / "tokenizer_2";
  const auto tokenizer = T5Tokenizer::from_file((tokenizer_dir / "spiece.model").string());
  const auto config = demo_t5_config(transformer_config(options), tokenizer.vocab_size());
  seed_for(options, 3);
  T5EncoderModel t5(config);
  t5->to(file_dtype(options));
  // Sharded like the published text_encoder_2 (two files and an index).
  uint64_t total = 0;
  for (const auto& [name, tensor] : io::module_state(*t5)) total += tensor.numel() * tensor.element_size();
  models::save_component(dir, *t5, config.to_json(), total / 2 + 1, "model");
}

}  // namespace remat::encoders
