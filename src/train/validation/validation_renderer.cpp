// Rendering a run's validation images with the live training transformer. See Note [Validation
// and the training run] (remat/train/validation/validation_images.h) for the random state and memory rules.
#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "string_helpers.h"
#include "remat/autocast.h"
#include "remat/util/generator_guard.h"
#include "remat/memory.h"
#include "remat/image/png_file.h"
#include "remat/io/safetensors.h"
#include "remat/sample/sampler.h"
#include "remat/train/family/model_source.h"
#include "remat/train/family/text_to_image.h"
#include "remat/train/family/transformer.h"
#include "remat/train/run/ema.h"
#include "remat/train/validation/validation_images.h"

namespace remat::train {
namespace fs = std::filesystem;
namespace {

using remat::detail::render_number;

// Loading an encoder initialises its modules from the global CPU generator before the weights
// replace them; the training run saves that generator in its checkpoints, so it must come out of
// validation as it went in.
// Eval mode for the lifetime of the guard, then the mode the module had (training).
class EvalMode {
 public:
  explicit EvalMode(torch::nn::Module& module) : module_(module), was_training_(module.is_training()) {
    module_.eval();
  }
  ~EvalMode() { module_.train(was_training_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
};

// The largest side decoded in one piece.
constexpr int64_t kValidationTilingAbove = 1024;

// The scale of classifier-free guidance on the negative prompt: validation_guidance_real (FLUX.1's
// true CFG), or validation_guidance itself for families whose pipelines' guidance_scale is CFG
// (MageFlow: SimpleTuner passes validation_guidance to MageFlowPipeline with the negative prompt).
double cfg_scale(const TrainConfig& config) {
  return model_family(config.model_family).guidance_is_cfg ? config.validation_guidance
                                                           : config.validation_guidance_real;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

struct ValidationRenderer::State {
  TrainConfig config;
  LogFn log;
  std::string pipeline_folder;
  std::string output_dir;  // output_dir/validation_images
  std::vector<ValidationPrompt> prompts;
  std::vector<ValidationResolution> resolutions;
  std::vector<sample::PromptEmbeddings> embeddings;  // per prompt, float32 on the CPU
  std::vector<at::Tensor> references;  // per prompt: a Kontext edit's reference latents (C, h, w), else undefined
  std::vector<std::string> reference_paths;  // per prompt: where they came from, else empty
  std::optional<sample::PromptEmbeddings> negative;  // when real CFG is on
  std::unique_ptr<FamilyPipeline> pipeline;          // the family's encoders and scheduler
  encoders::EncoderSettings encoder_settings;
  uint64_t seed = 0;
};

ValidationRenderer::ValidationRenderer(const TrainConfig& config, LogFn log, std::vector<ValidationEdit> edits)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.config = config;
  s.log = std::move(log);
  memory::install_cpu_tracking();  // idempotent; the peaks read 0 without it
  s.pipeline_folder = validation_pipeline_folder(config);
  s.prompts = validation_prompts(config);
  s.resolutions = parse_validation_resolutions(config.validation_resolution);
  s.output_dir = (fs::path(config.output_dir) / "validation_images").string();
  s.seed = config.validation_seed_value();
  // The caching phase's dtype and device: the embeddings are what training sees for the same captions.
  s.encoder_settings.dtype = config.mixed_precision == "bf16" ? at::kBFloat16 : at::kFloat;
  s.encoder_settings.max_sequence_length = config.tokenizer_max_length;
  s.encoder_settings.device = at::Device(config.device);
  s.encoder_settings.flavour = config.model_flavour;
  // The pipeline's encoders and scheduler with the run's own transformer (checked to fit them).
  const TransformerSpec transformer = transformer_spec_of(config, resolve_model_source(config));
  s.pipeline = make_text_to_image(model_family(config.model_family), s.pipeline_folder, config.model_flavour,
                                  &transformer, config.variant.value_or(""));

  const auto start = std::chrono::steady_clock::now();
  memory::PeakScope peak;
  {
    GlobalGeneratorGuard keep_global_generator;
    torch::NoGradGuard no_grad;
    const auto encoders = s.pipeline->load_prompt_encoder(s.encoder_settings);
    const auto encode = [&](const std::string& prompt) {
      auto e = encoders->encode_caption(prompt);
      for (const auto& w : e.warnings) s.log("[validation] " + w);
      // float32, as batch_to gives the training step its cached embeddings.
      const auto to_float = [](const at::Tensor& t) { return t.defined() ? t.to(at::kFloat).contiguous() : t; };
      return sample::PromptEmbeddings{to_float(e.prompt_embeds), to_float(e.pooled_prompt_embeds)};
    };
    for (const auto& p : s.prompts) s.embeddings.push_back(encode(p.prompt));
    if (cfg_scale(config) > 1.0) s.negative = encode(config.validation_negative_prompt);
  }  // the text encoders are freed here
  s.references.resize(s.prompts.size());
  s.reference_paths.resize(s.prompts.size());
  for (auto& edit : edits) {
    for (const auto& p : s.prompts) {
      if (p.shortname == edit.prompt.shortname) {
        throw ValidationError("user_prompt_library", config.user_prompt_library.value_or(""),
                              "[validation] prompt shortname '" + p.shortname + "' is also the name of a Kontext "
                              "validation edit (<dataset id>_<n>); rename the library entry");
      }
    }
    const auto text = io::SafetensorsFile::open(edit.text_path);
    const auto pooled = text.contains("pooled_prompt_embeds") ? text.tensor("pooled_prompt_embeds", at::kFloat)
                                                               : at::Tensor();
    s.embeddings.push_back({text.tensor("prompt_embeds", at::kFloat), pooled});
    s.references.push_back(io::SafetensorsFile::open(edit.reference_latents_path).tensor("latents", at::kFloat));
    s.reference_paths.push_back(edit.reference_latents_path);
    s.prompts.push_back(std::move(edit.prompt));
  }
  s.log("[validation] " + std::to_string(s.prompts.size()) + " prompt(s) x " + std::to_string(s.resolutions.size()) +
        " resolution(s) every " + std::to_string(config.validation_interval()) + " steps; prompts encoded in " +
        render_number(seconds_since(start)) + "s (peak " + memory::format_bytes(peak.peak_bytes()) +
        "), text encoders freed; kept " + memory::format_bytes(held_bytes()) + " of embeddings");
}

ValidationRenderer::~ValidationRenderer() = default;

const std::vector<ValidationPrompt>& ValidationRenderer::prompts() const { return state_->prompts; }
const std::vector<ValidationResolution>& ValidationRenderer::resolutions() const { return state_->resolutions; }

int64_t ValidationRenderer::held_bytes() const {
  int64_t bytes = 0;
  const auto add = [&](const sample::PromptEmbeddings& e) {
    bytes += e.prompt_embeds.nbytes() + (e.pooled_prompt_embeds.defined() ? e.pooled_prompt_embeds.nbytes() : 0);
  };
  for (const auto& e : state_->embeddings) add(e);
  if (state_->negative) add(*state_->negative);
  for (const auto& r : state_->references) bytes += r.defined() ? r.nbytes() : 0;
  return static_cast<int64_t>(bytes);
}

ValidationRun ValidationRenderer::render(Transformer& transformer, int64_t step, const at::Device& device,
                                         ExponentialMovingAverage* ema) {
  State& s = *state_;
  ValidationRun report;
  report.step = step;
  const auto start = std::chrono::steady_clock::now();
  memory::PeakScope peak(device);
  report.baseline_bytes = peak.baseline_bytes();
  GlobalGeneratorGuard keep_global_generator;

  sample::SamplingSettings settings;
  settings.num_inference_steps = s.config.validation_num_inference_steps;
  settings.guidance_scale = s.config.validation_guidance;
  settings.true_cfg_scale = s.negative ? cfg_scale(s.config) : 1.0;
  settings.no_cfg_until_step = s.config.validation_no_cfg_until_timestep;
  settings.seed = s.seed;
  settings.vae_scale_factor = s.pipeline->vae_scale_factor();

  // 1. Every picture's latents, with the transformer as the training step runs it (the same
  //    autocast), in eval mode and without gradients.
  //    With EMA weights (SimpleTuner's ema_validation), each set of weights renders in turn.
  std::vector<bool> weights_ema;  // per set of weights: the average (true) or the trained weights
  const std::string& which = s.config.ema_validation;
  if (!ema || which != "ema_only") weights_ema.push_back(false);
  if (ema && (which == "ema_only" || which == "comparison")) weights_ema.push_back(true);
  // latents[w][p]: the pictures of prompt p, one per resolution, with weights w.
  std::vector<std::vector<std::vector<at::Tensor>>> latents(weights_ema.size(),
                                                            std::vector<std::vector<at::Tensor>>(s.prompts.size()));
  for (size_t w = 0; w < weights_ema.size(); ++w) {
    std::unique_ptr<ExponentialMovingAverage::Swap> average;
    if (weights_ema[w]) average = std::make_unique<ExponentialMovingAverage::Swap>(*ema);
    torch::NoGradGuard no_grad;
    EvalMode eval(transformer.module());
    const auto denoiser = s.pipeline->denoiser_for(transformer);
    const std::optional<at::ScalarType> autocast =
        s.config.mixed_precision == "bf16" ? std::optional<at::ScalarType>(at::kBFloat16) : std::nullopt;
    AutocastGuard mixed_precision(AutocastSnapshot::with(autocast, device));
    for (size_t p = 0; p < s.prompts.size(); ++p) {
      for (const auto& r : s.resolutions) {
        settings.width = r.width;
        settings.height = r.height;
        settings.reference_latents = s.references[p];  // a Kontext edit's, else undefined
        // A fresh generator per picture (SimpleTuner's _get_generator): what changes between
        // steps is the model, not the noise.
        latents[w][p].push_back(denoiser->denoise(s.embeddings[p], s.negative ? &*s.negative : nullptr, settings));
      }
    }
  }

  // 2. The VAE, loaded for this validation only, decodes them on the run's device.
  fs::create_directories(s.output_dir);
  {
    torch::NoGradGuard no_grad;
    const auto load_start = std::chrono::steady_clock::now();
    encoders::EncoderSettings on_device = s.encoder_settings;
    on_device.device = device;
    const auto vae = s.pipeline->load_autoencoder(on_device);
    report.vae_load_seconds = seconds_since(load_start);
    for (size_t w = 0; w < weights_ema.size(); ++w) {
      for (size_t p = 0; p < s.prompts.size(); ++p) {
        for (size_t r = 0; r < s.resolutions.size(); ++r) {
          const auto& res = s.resolutions[r];
          // Tiled above 1024 px a side, as `remat sample` decodes by default: an untiled 1024x1024
          // decode alone holds several GiB of activations (docs/VAE.md).
          vae->set_tiling(std::max(res.width, res.height) > kValidationTilingAbove);
          const at::Tensor pixels =
              sample::to_uint8_image(vae->decode_latents(latents[w][p][r]), vae->pixel_conversion());
          const std::string name =
              validation_image_file_name(step, s.prompts[p].shortname, static_cast<int64_t>(r), res, weights_ema[w]);
          image::PngText text = {{"prompt", s.prompts[p].prompt},
                                  {"seed", std::to_string(s.seed)},
                                  {"steps", std::to_string(settings.num_inference_steps)},
                                  {"guidance", render_number(settings.guidance_scale)},
                                  {"training_step", std::to_string(step)},
                                  {"width", std::to_string(res.width)},
                                  {"height", std::to_string(res.height)},
                                  {"model", s.config.pretrained_model_name_or_path.value_or("")},
                                  {"software", "remat"}};
          if (weights_ema[w]) text.emplace_back("weights", "ema");
          if (!s.reference_paths[p].empty()) text.emplace_back("reference_latents", s.reference_paths[p]);
          if (s.negative) {
            text.emplace_back("negative_prompt", s.config.validation_negative_prompt);
            text.emplace_back("true_cfg_scale", render_number(settings.true_cfg_scale));
          }
          const std::string path = (fs::path(s.output_dir) / name).string();
          image::write_png(path, pixels, text);
          report.files.push_back(path);
        }
      }
    }
  }  // the VAE is freed here
  write_validation_gallery(s.output_dir, s.prompts);
  report.images = static_cast<int64_t>(report.files.size());
  report.seconds = seconds_since(start);
  report.peak_bytes = peak.peak_bytes();
  s.log("[validation] step " + std::to_string(step) + ": " + std::to_string(report.images) + " image(s) in " +
        render_number(report.seconds) + "s (VAE load " + render_number(report.vae_load_seconds) + "s), peak " +
        memory::format_bytes(report.peak_bytes) + " (" + memory::format_bytes(report.peak_bytes - report.baseline_bytes) +
        " above the " + memory::format_bytes(report.baseline_bytes) + " held by training) -> " + s.output_dir +
        "/index.html");
  return report;
}

}  // namespace remat::train
