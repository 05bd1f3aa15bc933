#include "remat/encoders/flux_encoders.h"

#include <filesystem>

#include <torch/torch.h>

#include "remat/encoders/clip_text_model.h"
#include "remat/encoders/t5_config.h"
#include "remat/util/error.h"
#include "remat/memory.h"

namespace remat::encoders {
namespace {

namespace fs = std::filesystem;

std::string file_in(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

template <class Module>
LoadedComponent describe(const std::string& name, const std::string& dir, const Module& module) {
  LoadedComponent loaded{name, dir};
  for (const auto& p : module->parameters()) {
    loaded.parameters += p.numel();
    loaded.bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  return loaded;
}

at::Tensor ids_tensor(const std::vector<int64_t>& ids, const at::Device& device) {
  return torch::tensor(ids, torch::kLong).unsqueeze(0).to(device);
}

}  // namespace

std::vector<std::string> flux_encoder_components(const FluxEncodersOptions& options) {
  std::vector<std::string> names;
  if (options.load_text) names = {"text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"};
  if (options.load_vae) names.push_back("vae");
  return names;
}

namespace {

// Memory admission of the encoders: their weights, counted from the configs alone, must fit in
// host memory (they are built there, then moved to the device) before anything is built. FLUX.1's
// T5-XXL alone is 4.8 billion parameters: 19 GB in float32.
void admit_encoders(const PipelineFolder& folder, const FluxEncodersOptions& options) {
  const int64_t element = static_cast<int64_t>(c10::elementSize(options.dtype));
  int64_t need = 0;
  std::string parts;
  const auto add = [&](const char* component, int64_t parameters) {
    need += parameters * element;
    parts += std::string(parts.empty() ? "" : ", ") + component + " " + memory::format_bytes(parameters * element);
  };
  if (options.load_vae) {
    add("vae", parameter_count(AutoencoderKLConfig::from_file(file_in(folder.directory("vae"), "config.json"))));
  }
  if (options.load_text) {
    add("text_encoder", parameter_count(ClipTextConfig::from_file(file_in(folder.directory("text_encoder"), "config.json"))));
    add("text_encoder_2", parameter_count(T5Config::from_file(file_in(folder.directory("text_encoder_2"), "config.json"))));
  }
  const c10::Device cpu(c10::kCPU);
  const int64_t available = memory::available_bytes(cpu) - memory::current_bytes(cpu);
  if (need > available) {
    throw_value_error("[memory] loading the encoders of '" + folder.root + "' in " + c10::toString(options.dtype) +
                      " needs " + memory::format_bytes(need) + " for their weights (" + parts + "); this machine has " +
                      memory::format_bytes(available) + " available" +
                      (options.dtype == at::kFloat ? std::string(": use bfloat16 (--mixed_precision=bf16, --dtype=bf16)")
                                                   : std::string()));
  }
}

}  // namespace

FluxEncoders FluxEncoders::load(const PipelineFolder& folder, const FluxEncodersOptions& options) {
  if (options.dtype != at::kFloat && options.dtype != at::kBFloat16) {
    throw_value_error(std::string("[pipeline] encoder dtype must be float32 or bfloat16, got ") +
                      c10::toString(options.dtype));
  }
  if (options.max_sequence_length < 1 || options.max_sequence_length > 4096) {
    throw_value_error("[pipeline] max_sequence_length (tokenizer_max_length) must be in [1, 4096], got " +
                      std::to_string(options.max_sequence_length));
  }
  admit_encoders(folder, options);
  FluxEncoders encoders;
  encoders.options_ = options;
  if (options.load_vae) {
    const auto& dir = folder.directory("vae");
    const auto config = AutoencoderKLConfig::from_file(file_in(dir, "config.json"));
    models::open_component_weights(dir, folder.variant);  // the index and its shards agree before anything is built
    encoders.vae_ = load_autoencoder_kl(models::find_component_weights(dir, folder.variant).files, config, options.dtype);
    encoders.vae_->to(options.device);
    encoders.vae_->eval();
    encoders.loaded_.push_back(describe("vae", dir, encoders.vae_));
  }
  if (options.load_text) {
    const auto& clip_dir = folder.directory("text_encoder");
    const auto clip_config = ClipTextConfig::from_file(file_in(clip_dir, "config.json"));
    models::open_component_weights(clip_dir, folder.variant);
    encoders.clip_ = load_clip_text_model(models::find_component_weights(clip_dir, folder.variant).files, clip_config,
                                          options.dtype);
    encoders.clip_->to(options.device);
    encoders.clip_->eval();
    encoders.loaded_.push_back(describe("text_encoder", clip_dir, encoders.clip_));

    const auto& t5_dir = folder.directory("text_encoder_2");
    const auto t5_config = T5Config::from_file(file_in(t5_dir, "config.json"));
    encoders.t5_ = load_t5_encoder(models::open_component_weights(t5_dir, folder.variant), t5_config, options.dtype);
    encoders.t5_->to(options.device);
    encoders.t5_->eval();
    encoders.loaded_.push_back(describe("text_encoder_2", t5_dir, encoders.t5_));

    encoders.clip_tokenizer_ = ClipTokenizer::from_directory(folder.directory("tokenizer"));
    encoders.t5_tokenizer_ = T5Tokenizer::from_file(file_in(folder.directory("tokenizer_2"), "spiece.model"));
    // A tokenizer whose ids the encoder cannot embed would fail deep inside the first forward.
    if (encoders.clip_tokenizer_->vocab_size() > clip_config.vocab_size) {
      throw_value_error("[pipeline] tokenizer/ has " + std::to_string(encoders.clip_tokenizer_->vocab_size()) +
                        " tokens but text_encoder/config.json's vocab_size is " +
                        std::to_string(clip_config.vocab_size) + "; the two come from different models");
    }
    if (encoders.t5_tokenizer_->vocab_size() > t5_config.vocab_size) {
      throw_value_error("[pipeline] tokenizer_2/spiece.model has " +
                        std::to_string(encoders.t5_tokenizer_->vocab_size()) +
                        " tokens (with T5's 100 extra ids) but text_encoder_2/config.json's vocab_size is " +
                        std::to_string(t5_config.vocab_size) + "; the two come from different models");
    }
  }
  return encoders;
}

FluxPromptEmbeddings FluxEncoders::encode_prompt(const std::string& caption) {
  if (!has_text()) throw_value_error("[pipeline] encode_prompt needs the text encoders, which were not loaded");
  const auto clip_tokens = clip_tokenizer_->encode(caption, clip_->config().max_position_embeddings);
  const auto t5_tokens = t5_tokenizer_->encode(caption, options_.max_sequence_length);
  FluxPromptEmbeddings out;
  out.clip_ids = clip_tokens.ids;
  out.t5_ids = t5_tokens.ids;
  for (auto m : clip_tokens.attention_mask) out.clip_content_tokens += m;
  for (auto m : t5_tokens.attention_mask) out.t5_content_tokens += m;
  out.clip_content_tokens -= 2;  // bos, eos
  out.t5_content_tokens -= 1;    // </s>
  if (!clip_tokens.removed_text.empty()) out.warnings.push_back(clip_tokens.truncation_message());
  if (!t5_tokens.removed_text.empty()) {
    out.warnings.push_back(t5_truncation_warning(options_.max_sequence_length, t5_tokens.removed_text));
  }
  torch::NoGradGuard no_grad;
  const at::Device& device = options_.device;
  out.pooled_prompt_embeds =
      clip_->forward(ids_tensor(clip_tokens.ids, device)).pooled_output.squeeze(0).to(at::kCPU).contiguous();
  out.prompt_embeds = t5_->forward(ids_tensor(t5_tokens.ids, device)).squeeze(0).to(at::kCPU).contiguous();
  return out;
}

int64_t FluxEncoders::vae_scale_factor() const {
  if (!has_vae()) throw_value_error("[pipeline] the VAE was not loaded");
  return int64_t{1} << (vae_->config().block_out_channels.size() - 1);
}

AutoencoderKL& FluxEncoders::vae() {
  if (!has_vae()) throw_value_error("[pipeline] the VAE was not loaded");
  return vae_;
}

at::Tensor FluxEncoders::encode_image(const at::Tensor& vae_input, c10::optional<at::Generator> generator) {
  const int64_t factor = vae_scale_factor();
  if (vae_input.dim() != 4 || vae_input.size(0) != 1 || vae_input.size(1) != vae_->config().in_channels) {
    throw_value_error("[pipeline] encode_image takes one image (1, " + std::to_string(vae_->config().in_channels) +
                      ", H, W), got " + c10::str(vae_input.sizes()));
  }
  const int64_t multiple = 2 * factor;
  if (vae_input.size(2) % multiple != 0 || vae_input.size(3) % multiple != 0) {
    throw_value_error("[pipeline] image height and width must be multiples of " + std::to_string(multiple) +
                      " (the VAE's " + std::to_string(factor) + "x downscale times Flux's 2 x 2 patches), got " +
                      std::to_string(vae_input.size(3)) + " x " + std::to_string(vae_input.size(2)));
  }
  torch::NoGradGuard no_grad;
  const auto posterior = vae_->encode(vae_input.to(options_.device, options_.dtype));
  const auto z = generator ? posterior.sample(generator) : posterior.mode();
  return vae_->to_transformer_latents(z).to(at::kCPU, at::kFloat).squeeze(0).contiguous();
}

at::Tensor FluxEncoders::decode_latents(const at::Tensor& latents) {
  if (!has_vae()) throw_value_error("[pipeline] the VAE was not loaded");
  if (latents.dim() != 3 || latents.size(0) != vae_->config().latent_channels) {
    throw_value_error("[pipeline] decode_latents takes latents (" + std::to_string(vae_->config().latent_channels) +
                      ", h, w), got " + c10::str(latents.sizes()));
  }
  torch::NoGradGuard no_grad;
  const auto z = vae_->from_transformer_latents(latents.unsqueeze(0).to(options_.device, options_.dtype));
  // In the VAE's dtype, as diffusers' pipelines hand the decode to VaeImageProcessor.postprocess
  // (which clamps in that dtype: remat/sample/sampler.h to_uint8_image).
  return vae_->decode(z).to(at::kCPU);
}

void FluxEncoders::set_tiling(bool tiled) { vae()->set_tiling(tiled); }

EncodedPrompt FluxEncoders::encode_caption(const std::string& caption) {
  auto e = encode_prompt(caption);
  return {std::move(e.prompt_embeds), std::move(e.pooled_prompt_embeds), std::move(e.warnings)};
}

namespace {

FluxEncodersOptions options_of(const EncoderSettings& settings, bool text, bool vae) {
  FluxEncodersOptions options;
  options.dtype = settings.dtype;
  options.device = settings.device;
  options.max_sequence_length = settings.max_sequence_length;
  options.load_text = text;
  options.load_vae = vae;
  return options;
}

AutoencoderKLConfig vae_config_of(const PipelineFolder& folder) {
  return AutoencoderKLConfig::from_file(file_in(folder.directory("vae"), "config.json"));
}

}  // namespace

FamilyEncoders flux_family_encoders() {
  FamilyEncoders f;
  f.layout = flux_pipeline_layout();
  f.text_components = flux_encoder_components(options_of({}, true, false));
  f.image_components = flux_encoder_components(options_of({}, false, true));
  f.pooled = true;         // CLIP's pooled output
  f.pixel_multiple = 16;   // the published VAE's 8x downsampling times the transformer's 2x2 packing
  f.load_text = [](const PipelineFolder& folder, const EncoderSettings& settings) -> std::unique_ptr<PromptEncoder> {
    return std::make_unique<FluxEncoders>(FluxEncoders::load(folder, options_of(settings, true, false)));
  };
  f.load_image = [](const PipelineFolder& folder,
                    const EncoderSettings& settings) -> std::unique_ptr<ImageAutoencoder> {
    return std::make_unique<FluxEncoders>(FluxEncoders::load(folder, options_of(settings, false, true)));
  };
  f.vae_scale_factor = [](const PipelineFolder& folder) { return vae_config_of(folder).spatial_factor(); };
  f.image_weight_bytes = [](const PipelineFolder& folder, at::ScalarType dtype) {
    return parameter_count(vae_config_of(folder)) * static_cast<int64_t>(c10::elementSize(dtype));
  };
  f.image_peak_bytes = [](const PipelineFolder& folder, int64_t width, int64_t height, at::ScalarType dtype,
                          bool tiled) {
    return vae_peak_bytes(vae_config_of(folder), width, height, static_cast<int64_t>(c10::elementSize(dtype)), tiled);
  };
  return f;
}

}  // namespace remat::encoders
