// run_pipeline: text to image with a diffusers Flux pipeline folder (remat/sample/pipeline.h).
// The order of work is FluxPipeline's, with each model freed as soon as its part is done, so at
// most one of the three (text encoders, transformer, VAE) is in memory at a time.

#include "remat/sample/pipeline.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>

#include <torch/torch.h>

#include "remat/build_info.h"
#include "remat/duration.h"
#include "remat/encoders/autoencoder_kl_config.h"
#include "remat/encoders/clip_text_model.h"
#include "remat/encoders/flux_encoders.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/encoders/t5_config.h"
#include "remat/error.h"
#include "remat/memory.h"
#include "remat/sample/scheduler.h"

namespace remat::sample {
namespace {

std::string file_in(const std::string& dir, const char* name) {
  return (std::filesystem::path(dir) / name).string();
}

bool uses_true_cfg(const SampleRequest& r) {
  return r.settings.true_cfg_scale > 1.0 && r.negative_prompt.has_value();
}

// The three models must agree on the widths they exchange; a folder assembled from different
// models would otherwise fail deep inside the first transformer call.
void check_components_fit(const encoders::PipelineFolder& folder, const models::FluxConfig& config,
                          const encoders::AutoencoderKLConfig& vae) {
  if (vae.latent_channels * 4 != config.in_channels) {
    throw_value_error("[sample] '" + folder.root + "': vae/config.json has latent_channels " +
                      std::to_string(vae.latent_channels) + " but the transformer takes in_channels " +
                      std::to_string(config.in_channels) + " (4 latent channels per 2x2 patch); the components "
                      "come from different models");
  }
  const auto t5 = encoders::T5Config::from_file(file_in(folder.directory("text_encoder_2"), "config.json"));
  if (t5.d_model != config.joint_attention_dim) {
    throw_value_error("[sample] '" + folder.root + "': text_encoder_2/config.json has d_model " +
                      std::to_string(t5.d_model) + " but the transformer's joint_attention_dim is " +
                      std::to_string(config.joint_attention_dim) + "; the components come from different models");
  }
  const auto clip = encoders::ClipTextConfig::from_file(file_in(folder.directory("text_encoder"), "config.json"));
  if (clip.hidden_size != config.pooled_projection_dim) {
    throw_value_error("[sample] '" + folder.root + "': text_encoder/config.json has hidden_size " +
                      std::to_string(clip.hidden_size) + " but the transformer's pooled_projection_dim is " +
                      std::to_string(config.pooled_projection_dim) + "; the components come from different models");
  }
}

class Stages {
 public:
  explicit Stages(const PipelineEvents& events) : events_(events) {}
  void begin(const std::string& what) {
    start_ = std::chrono::steady_clock::now();
    if (events_.on_stage) events_.on_stage(what);
  }
  void end(const std::string& what) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (events_.on_stage) events_.on_stage(what + " in " + format_duration(seconds));
  }
  void warn(const std::string& warning) const {
    if (events_.on_warning) events_.on_warning(warning);
  }

 private:
  const PipelineEvents& events_;
  std::chrono::steady_clock::time_point start_;
};

PromptEmbeddings to_embeddings(const encoders::FluxPromptEmbeddings& e) {
  return {e.prompt_embeds, e.pooled_prompt_embeds};
}

// Memory admission of sampling, before any model loads: the largest transient of each stage must
// fit what the device has. Denoising without a fused attention kernel (LibTorch < 2.0) holds
// one block's score matrix and its softmax (heads x tokens^2 in float32); decoding holds
// encoders::vae_peak_bytes. (--width 16384 wanted 160 GB in one allocation before.)
void admit_sampling(const PipelineOptions& options, const std::vector<SampleRequest>& requests,
                    const models::FluxConfig& config, const encoders::AutoencoderKLConfig& vae) {
  const int64_t available = memory::available_bytes(options.device) - memory::current_bytes(options.device);
  const int64_t element_bytes = static_cast<int64_t>(c10::elementSize(options.dtype));
  for (const auto& r : requests) {
    const auto& s = r.settings;
    const std::string size = std::to_string(s.width) + " x " + std::to_string(s.height);
    const bool tiled = options.vae_tiling_above == 0 || std::max(s.width, s.height) > options.vae_tiling_above;
    const int64_t decode = encoders::vae_peak_bytes(vae, s.width, s.height, element_bytes, tiled);
    if (decode > available) {
      throw_value_error("[memory] decoding a " + size + " picture needs about " + memory::format_bytes(decode) +
                        "; this machine has " + memory::format_bytes(available) +
                        " available: lower --width/--height or --vae_tiling_above");
    }
    if (!build_info().fused_attention) {
      const double tokens = static_cast<double>(s.width / 16) * static_cast<double>(s.height / 16) +
                            static_cast<double>(options.max_sequence_length);
      const double scores = 2.0 * static_cast<double>(config.num_attention_heads) * tokens * tokens * 4;
      if (scores > static_cast<double>(available)) {
        throw_value_error("[memory] denoising a " + size + " picture needs about " +
                          memory::format_bytes(scores >= 9e18 ? INT64_MAX : static_cast<int64_t>(scores)) +
                          " for one attention's scores (" + std::to_string(config.num_attention_heads) + " heads x " +
                          std::to_string(static_cast<int64_t>(tokens)) + "^2 tokens, float32, without LibTorch "
                          "2.0's fused attention); this machine has " + memory::format_bytes(available) +
                          " available: lower --width/--height");
      }
    }
  }
}

}  // namespace

void check_requests(const std::vector<SampleRequest>& requests) {
  if (requests.empty()) throw_value_error("[sample] nothing to sample: no prompt given");
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& s = requests[i].settings;
    const std::string which = requests.size() > 1 ? " (prompt " + std::to_string(i + 1) + ")" : "";
    for (const auto& [name, value] : {std::pair<const char*, int64_t>{"width", s.width}, {"height", s.height}}) {
      if (value < 16 || value % 16 != 0) {
        throw_value_error(std::string("[sample] ") + name + " must be a positive multiple of 16, got " +
                          std::to_string(value) + which);
      }
      if (value > kMaxSampleSide) {
        throw_value_error(std::string("[sample] ") + name + " must be at most " + std::to_string(kMaxSampleSide) +
                          " pixels, got " + std::to_string(value) + which);
      }
    }
    if (s.num_inference_steps < 1 || s.num_inference_steps > kMaxInferenceSteps) {
      throw_value_error("[sample] num_inference_steps must be in [1, " + std::to_string(kMaxInferenceSteps) +
                        "], got " + std::to_string(s.num_inference_steps) + which);
    }
    if (!std::isfinite(s.guidance_scale) || !std::isfinite(s.true_cfg_scale)) {
      throw_value_error("[sample] guidance_scale and true_cfg_scale must be finite numbers" + which);
    }
  }
}

std::vector<at::Tensor> run_pipeline(const PipelineOptions& options, const std::vector<SampleRequest>& requests,
                                     const PipelineEvents& events) {
  // ---- everything checkable without running a model ----
  if (options.dtype != at::kFloat && options.dtype != at::kBFloat16) {
    throw_value_error(std::string("[sample] dtype must be float32 or bfloat16, got ") + c10::toString(options.dtype));
  }
  if (options.max_sequence_length < 1 || options.max_sequence_length > 512) {
    throw_value_error("[sample] max_sequence_length must be in [1, 512] (FluxPipeline's limit), got " +
                      std::to_string(options.max_sequence_length));
  }
  if (options.vae_tiling_above < 0) {
    throw_value_error("[sample] vae_tiling_above must be >= 0 pixels, got " + std::to_string(options.vae_tiling_above));
  }
  check_requests(requests);
  const std::vector<std::string> components = {"scheduler", "text_encoder", "text_encoder_2", "tokenizer",
                                               "tokenizer_2", "transformer", "vae"};
  const auto folder = encoders::PipelineFolder::open(options.folder, components);
  const auto scheduler =
      FlowMatchSchedulerConfig::from_json_file(file_in(folder.directory("scheduler"), "scheduler_config.json"));
  const std::string transformer_dir = folder.directory("transformer");
  const auto config = models::FluxConfig::from_json_file(file_in(transformer_dir, "config.json"));
  const auto vae_config = encoders::AutoencoderKLConfig::from_file(file_in(folder.directory("vae"), "config.json"));
  check_components_fit(folder, config, vae_config);
  admit_sampling(options, requests, config, vae_config);
  const int64_t vae_scale_factor = int64_t{1} << (vae_config.block_out_channels.size() - 1);
  std::vector<SampleRequest> sized = requests;  // the latent grid follows this folder's VAE
  for (size_t i = 0; i < sized.size(); ++i) {
    auto& s = sized[i].settings;
    s.vae_scale_factor = vae_scale_factor;
    for (const auto& [name, value] : {std::pair<const char*, int64_t>{"width", s.width}, {"height", s.height}}) {
      if (value % (2 * vae_scale_factor) != 0) {
        throw_value_error(std::string("[sample] ") + name + " must be a multiple of " +
                          std::to_string(2 * vae_scale_factor) + " for this pipeline's VAE (" +
                          std::to_string(vae_scale_factor) + "x downsampling, then 2x2 packing), got " +
                          std::to_string(value));
      }
    }
  }
  Stages stages(events);
  const std::vector<models::LoraFile> loras = read_loras_for(options.loras, config);
  for (const auto& lora : loras) {
    for (const auto& w : lora.warnings) stages.warn("LoRA '" + lora.path + "': " + w);
  }

  // ---- 1. text encoders: every prompt and negative prompt, then freed ----
  const size_t n = requests.size();
  std::vector<PromptEmbeddings> positive(n);
  std::vector<std::optional<PromptEmbeddings>> negative(n);
  {
    stages.begin("loading the text encoders");
    encoders::FluxEncodersOptions text_options;
    text_options.dtype = options.dtype;
    text_options.max_sequence_length = options.max_sequence_length;
    text_options.device = options.device;
    text_options.load_vae = false;
    auto text = encoders::FluxEncoders::load(folder, text_options);
    stages.end("loaded the text encoders");
    stages.begin("encoding the prompts");
    std::map<std::string, PromptEmbeddings> encoded;  // a prompt repeated is encoded once
    auto encode = [&](const std::string& prompt) {
      auto it = encoded.find(prompt);
      if (it != encoded.end()) return it->second;
      const auto e = text.encode_prompt(prompt);
      for (const auto& w : e.warnings) stages.warn(w);
      return encoded.emplace(prompt, to_embeddings(e)).first->second;
    };
    for (size_t i = 0; i < n; ++i) {
      positive[i] = encode(requests[i].prompt);
      if (uses_true_cfg(requests[i])) negative[i] = encode(*requests[i].negative_prompt);
    }
    stages.end("encoded " + std::to_string(encoded.size()) + (encoded.size() == 1 ? " prompt" : " prompts"));
  }

  // ---- 2. the transformer (with the LoRAs merged): every request denoised, then freed ----
  std::vector<at::Tensor> latents(n);
  {
    stages.begin("loading the transformer" +
                 (loras.empty() ? std::string() : " and merging " + std::to_string(loras.size()) +
                                                      (loras.size() == 1 ? " LoRA" : " LoRAs")));
    models::Flux transformer = load_transformer_with_loras(transformer_dir, options.dtype, options.device, loras,
                                                           options.loras, options.base_model_precision);
    stages.end("loaded the transformer");
    for (size_t i = 0; i < n; ++i) {
      stages.begin("denoising picture " + std::to_string(i + 1) + " of " + std::to_string(n));
      StepCallback on_step;
      if (events.on_step) on_step = [&, i](int64_t step, int64_t steps) { events.on_step(i, step, steps); };
      latents[i] = denoise(*transformer, scheduler, positive[i], negative[i] ? &*negative[i] : nullptr,
                           sized[i].settings, on_step);
      stages.end("denoised picture " + std::to_string(i + 1));
    }
  }
  positive.clear();
  negative.clear();

  // ---- 3. the VAE decodes every picture ----
  stages.begin("loading the VAE");
  encoders::FluxEncodersOptions vae_options;
  vae_options.dtype = options.dtype;
  vae_options.device = options.device;
  vae_options.load_text = false;
  auto vae_holder = encoders::FluxEncoders::load(folder, vae_options);
  auto& vae = vae_holder.vae();
  stages.end("loaded the VAE");
  std::vector<at::Tensor> pictures;
  for (size_t i = 0; i < n; ++i) {
    const auto& s = requests[i].settings;
    const bool tiled = options.vae_tiling_above == 0 || std::max(s.width, s.height) > options.vae_tiling_above;
    vae->set_tiling(tiled);
    stages.begin("decoding picture " + std::to_string(i + 1) + (tiled ? " (tiled)" : ""));
    at::Tensor pixels;
    {
      torch::NoGradGuard no_grad;
      const at::Tensor z = vae->from_transformer_latents(latents[i].unsqueeze(0).to(options.device, options.dtype));
      const at::Tensor decoded = vae->decode(z);
      // to_uint8_image would write NaN as black: a picture of nothing, and exit 0.
      if (!at::isfinite(decoded).all().item<bool>()) {
        const bool latents_finite = at::isfinite(z).all().item<bool>();
        throw_value_error("[sample] picture " + std::to_string(i + 1) + " came out NaN or inf " +
                          (latents_finite ? std::string("in the VAE's decode (vae/ weights)")
                                          : std::string("in denoising (the transformer's weights or a LoRA)")) +
                          "; nothing is written");
      }
      pixels = to_uint8_image(decoded);
    }
    latents[i] = at::Tensor();
    stages.end("decoded picture " + std::to_string(i + 1));
    if (events.on_image) events.on_image(i, pixels);
    pictures.push_back(pixels);
  }
  return pictures;
}

}  // namespace remat::sample
