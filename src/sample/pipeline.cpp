// run_pipeline: text to image with a diffusers pipeline folder (remat/sample/pipeline.h). The
// order of work is diffusers' FluxPipeline.__call__'s, with each model freed as soon as its part
// is done, so at most one of the three (text encoders, transformer, autoencoder) is in memory at
// a time.

#include "remat/sample/pipeline.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>

#include <torch/torch.h>

#include "remat/duration.h"
#include "remat/image/image_file.h"
#include "remat/sample/kontext.h"
#include "remat/util/error.h"

namespace remat::sample {
namespace {

bool uses_true_cfg(const SampleRequest& r) {
  return r.settings.true_cfg_scale > 1.0 && r.negative_prompt.has_value();
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

}  // namespace

void check_requests(const std::vector<SampleRequest>& requests) {
  if (requests.empty()) throw_value_error("[sample] nothing to sample: no prompt given");
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& s = requests[i].settings;
    const std::string which = requests.size() > 1 ? " (prompt " + std::to_string(i + 1) + ")" : "";
    for (const auto& [name, value] : {std::pair<const char*, int64_t>{"width", s.width}, {"height", s.height}}) {
      // The multiple a size must be of is the family's latent grid (TextToImage::check).
      if (value < 1) {
        throw_value_error(std::string("[sample] ") + name + " must be a positive number of pixels, got " +
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

std::vector<at::Tensor> run_pipeline(const TextToImage& pipeline, const PipelineOptions& options,
                                     const std::vector<SampleRequest>& requests, const PipelineEvents& events) {
  // ---- everything checkable without running a model ----
  if (options.dtype != at::kFloat && options.dtype != at::kBFloat16) {
    throw_value_error(std::string("[sample] dtype must be float32 or bfloat16, got ") + c10::toString(options.dtype));
  }
  if (options.vae_tiling_above < 0) {
    throw_value_error("[sample] vae_tiling_above must be >= 0 pixels, got " + std::to_string(options.vae_tiling_above));
  }
  check_requests(requests);
  Stages stages(events);
  std::vector<SampleRequest> sized = requests;  // the latent grid follows this pipeline's autoencoder
  const int64_t f = pipeline.vae_scale_factor();
  // FLUX.1 Kontext: the picture's size at max_area, and the size each input picture is encoded at
  // (from its header), before anything loads.
  std::vector<std::optional<PictureSize>> inputs(requests.size());
  for (size_t i = 0; i < sized.size(); ++i) {
    auto& s = sized[i].settings;
    s.vae_scale_factor = f;
    if (!pipeline.edits_pictures()) {
      if (sized[i].image) {
        throw_value_error("[sample] --image '" + *sized[i].image + "' needs a FLUX.1 Kontext pipeline (model_index.json "
                          "\"_class_name\": \"FluxKontextPipeline\"); this pipeline makes pictures from text only");
      }
      continue;
    }
    const PictureSize made = kontext_output_size(s.width, s.height, options.max_area, 2 * f);
    if (made.width != s.width || made.height != s.height) {
      stages.warn("picture " + std::to_string(i + 1) + ": " + std::to_string(s.width) + " x " +
                  std::to_string(s.height) + " becomes " + std::to_string(made.width) + " x " +
                  std::to_string(made.height) + " (Kontext makes its pictures at --max_area " +
                  std::to_string(options.max_area) + " pixels)");
      s.width = made.width;
      s.height = made.height;
    }
    if (sized[i].image) {
      const image::ImageInfo info = image::read_image_info(*sized[i].image);
      inputs[i] = kontext_input_size(info.width, info.height, 2 * f, options.image_auto_resize);
    }
  }
  pipeline.check(options, sized);
  const std::vector<models::LoraFile> loras = pipeline.read_loras(options.loras);
  for (const auto& lora : loras) {
    for (const auto& w : lora.warnings) stages.warn("LoRA '" + lora.path + "': " + w);
  }
  encoders::EncoderSettings models;
  models.dtype = options.dtype;
  models.device = options.device;
  models.max_sequence_length = options.max_sequence_length;

  // ---- 1. text encoders: every prompt and negative prompt, then freed ----
  const size_t n = requests.size();
  std::vector<PromptEmbeddings> positive(n);
  std::vector<std::optional<PromptEmbeddings>> negative(n);
  {
    stages.begin("loading the text encoders");
    const auto text = pipeline.load_prompt_encoder(models);
    stages.end("loaded the text encoders");
    stages.begin("encoding the prompts");
    std::map<std::string, PromptEmbeddings> encoded;  // a prompt repeated is encoded once
    auto encode = [&](const std::string& prompt) {
      auto it = encoded.find(prompt);
      if (it != encoded.end()) return it->second;
      auto e = text->encode_caption(prompt);
      for (const auto& w : e.warnings) stages.warn(w);
      return encoded.emplace(prompt, PromptEmbeddings{e.prompt_embeds, e.pooled_prompt_embeds}).first->second;
    };
    for (size_t i = 0; i < n; ++i) {
      positive[i] = encode(requests[i].prompt);
      if (uses_true_cfg(requests[i])) negative[i] = encode(*requests[i].negative_prompt);
    }
    stages.end("encoded " + std::to_string(encoded.size()) + (encoded.size() == 1 ? " prompt" : " prompts"));
  }

  // ---- 1b. Kontext: the autoencoder encodes the input pictures (FluxKontextPipeline.prepare_latents:
  //      the posterior's mode, shifted and scaled), then is freed ----
  if (std::any_of(inputs.begin(), inputs.end(), [](const auto& size) { return size.has_value(); })) {
    stages.begin("loading the VAE to encode the input pictures");
    const auto vae = pipeline.load_autoencoder(models);
    stages.end("loaded the VAE");
    for (size_t i = 0; i < n; ++i) {
      if (!inputs[i]) continue;
      const PictureSize size = *inputs[i];
      stages.begin("encoding input picture " + std::to_string(i + 1) + " at " + std::to_string(size.width) + " x " +
                   std::to_string(size.height));
      const at::Tensor picture = image::read_image(*requests[i].image);
      sized[i].settings.reference_latents = vae->encode_image(kontext_vae_input(picture, size), c10::nullopt);
      stages.end("encoded input picture " + std::to_string(i + 1));
    }
  }

  // ---- 2. the transformer (with the LoRAs merged): every request denoised, then freed ----
  std::vector<at::Tensor> latents(n);
  {
    stages.begin("loading the transformer" +
                 (loras.empty() ? std::string() : " and merging " + std::to_string(loras.size()) +
                                                      (loras.size() == 1 ? " LoRA" : " LoRAs")));
    const auto denoiser = pipeline.load_denoiser(models, loras, options.loras, options.base_model_precision);
    stages.end("loaded the transformer");
    for (size_t i = 0; i < n; ++i) {
      stages.begin("denoising picture " + std::to_string(i + 1) + " of " + std::to_string(n));
      StepCallback on_step;
      if (events.on_step) on_step = [&, i](int64_t step, int64_t steps) { events.on_step(i, step, steps); };
      latents[i] = denoiser->denoise(positive[i], negative[i] ? &*negative[i] : nullptr, sized[i].settings, on_step);
      stages.end("denoised picture " + std::to_string(i + 1));
    }
  }
  positive.clear();
  negative.clear();

  // ---- 3. the autoencoder decodes every picture ----
  stages.begin("loading the VAE");
  const auto vae = pipeline.load_autoencoder(models);
  stages.end("loaded the VAE");
  std::vector<at::Tensor> pictures;
  for (size_t i = 0; i < n; ++i) {
    const auto& s = sized[i].settings;
    const bool tiled = options.vae_tiling_above == 0 || std::max(s.width, s.height) > options.vae_tiling_above;
    vae->set_tiling(tiled);
    stages.begin("decoding picture " + std::to_string(i + 1) + (tiled ? " (tiled)" : ""));
    at::Tensor pixels;
    {
      torch::NoGradGuard no_grad;
      const at::Tensor decoded = vae->decode_latents(latents[i]);
      // to_uint8_image would write NaN as black: a picture of nothing, and exit 0.
      if (!at::isfinite(decoded).all().item<bool>()) {
        const bool latents_finite = at::isfinite(latents[i]).all().item<bool>();
        throw_value_error("[sample] picture " + std::to_string(i + 1) + " came out NaN or inf " +
                          (latents_finite ? std::string("in the VAE's decode (vae/ weights)")
                                          : std::string("in denoising (the transformer's weights or a LoRA)")) +
                          "; nothing is written");
      }
      pixels = to_uint8_image(decoded, vae->pixel_conversion());
    }
    latents[i] = at::Tensor();
    stages.end("decoded picture " + std::to_string(i + 1));
    if (events.on_image) events.on_image(i, pixels);
    pictures.push_back(pixels);
  }
  return pictures;
}

}  // namespace remat::sample
