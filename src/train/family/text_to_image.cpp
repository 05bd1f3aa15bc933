// A registered family's text-to-image parts (remat/train/family/text_to_image.h): each reads the family's
// descriptor, so `remat sample` and validation work for any family that registers its encoders,
// scheduler and denoiser.
#include "remat/train/family/text_to_image.h"

#include <algorithm>
#include <filesystem>

#include <torch/torch.h>

#include "remat/build_info.h"
#include "remat/util/error.h"
#include "remat/memory.h"
#include "remat/image/image_file.h"
#include "remat/models/lora_formats.h"
#include "remat/sample/kontext.h"
#include "remat/train/family/transformer.h"
#include "string_helpers.h"

namespace remat::train {
namespace {

namespace fs = std::filesystem;

// Owns the transformer it samples with (the Transformer's own denoiser refers to it).
class OwningDenoiser final : public sample::Denoiser {
 public:
  OwningDenoiser(std::unique_ptr<Transformer> model, const sample::FlowMatchSchedulerConfig& scheduler)
      : model_(std::move(model)), denoiser_(model_->denoiser(scheduler)) {}
  at::Tensor denoise(const sample::PromptEmbeddings& positive, const sample::PromptEmbeddings* negative,
                     const sample::SamplingSettings& settings, const sample::StepCallback& on_step) override {
    return denoiser_->denoise(positive, negative, settings, on_step);
  }

 private:
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<sample::Denoiser> denoiser_;
};

class FamilyTextToImage final : public FamilyPipeline {
 public:
  FamilyTextToImage(const ModelFamily& family, encoders::PipelineFolder folder, std::string flavour,
                    const TransformerSpec* transformer)
      : family_(family), folder_(std::move(folder)), flavour_(std::move(flavour)) {
    if (transformer != nullptr) {
      spec_ = *transformer;
    } else {
      spec_.family = family.name;
      spec_.flavour = flavour_;
      const std::string dir = folder_.directory("transformer");
      spec_.config_json = (fs::path(dir) / "config.json").string();
      spec_.weights = dir;
      spec_.variant = folder_.variant;
    }
    const auto& editing = family.picture_editing_pipeline_classes;
    edits_pictures_ = !folder_.root.empty() &&
                      std::find(editing.begin(), editing.end(), encoders::pipeline_class(folder_.root)) != editing.end();
    scheduler_ = family.scheduler(folder_, flavour_);
    vae_scale_factor_ = family.encoders.vae_scale_factor(folder_);
    if (family.check_pipeline) family.check_pipeline(folder_, spec_);
  }

  int64_t vae_scale_factor() const override { return vae_scale_factor_; }
  bool edits_pictures() const override { return edits_pictures_; }

  void check(const sample::PipelineOptions& options, const std::vector<sample::SampleRequest>& requests) const override {
    if (options.max_sequence_length < 1 || options.max_sequence_length > family_.max_sequence_length) {
      throw_value_error("[sample] max_sequence_length must be in [1, " + std::to_string(family_.max_sequence_length) +
                        "] (" + family_.display_name + " pipelines' limit), got " +
                        std::to_string(options.max_sequence_length));
    }
    // The latent grid: the autoencoder's factor times the family's patching (Flux packs 2x2).
    const int64_t multiple = family_.latents.spatial_multiple * vae_scale_factor_;
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto& s = requests[i].settings;
      for (const auto& [name, value] : {std::pair<const char*, int64_t>{"width", s.width}, {"height", s.height}}) {
        if (value % multiple != 0) {
          throw_value_error(std::string("[sample] ") + name + " must be a multiple of " + std::to_string(multiple) +
                            " for this pipeline's VAE (" + std::to_string(vae_scale_factor_) + "x downsampling, then " +
                            std::to_string(family_.latents.spatial_multiple) + "x" +
                            std::to_string(family_.latents.spatial_multiple) + " packing), got " + std::to_string(value));
        }
      }
    }
    admit(options, requests, multiple);
  }

  std::vector<models::LoraFile> read_loras(const std::vector<sample::LoraSpec>& loras) const override {
    if (loras.empty()) return {};
    TORCH_CHECK_VALUE(static_cast<bool>(family_.linear_layers), "[sample] model_family '", family_.name,
                      "' does not list its Linear layers, so LoRA files cannot be checked against it");
    return sample::read_loras_for(loras, family_.linear_layers(spec_));
  }

  std::unique_ptr<encoders::PromptEncoder> load_prompt_encoder(const encoders::EncoderSettings& settings) const override {
    return family_.encoders.load_text(folder_, settings);
  }

  std::unique_ptr<sample::Denoiser> load_denoiser(const encoders::EncoderSettings& settings,
                                                  const std::vector<models::LoraFile>& loras,
                                                  const std::vector<sample::LoraSpec>& specs,
                                                  const models::BasePrecision& precision) const override {
    if (settings.dtype != at::kFloat && settings.dtype != at::kBFloat16) {
      throw_value_error(std::string("[sample] dtype must be float32 or bfloat16, got ") + c10::toString(settings.dtype));
    }
    TransformerSpec spec = spec_;
    spec.dtype = settings.dtype;
    spec.base_precision = precision;
    auto model = load_transformer_with_loras(spec, loras, specs);
    model->module().to(settings.device);
    return std::make_unique<OwningDenoiser>(std::move(model), scheduler_);
  }

  std::unique_ptr<sample::Denoiser> denoiser_for(Transformer& transformer) const override {
    return transformer.denoiser(scheduler_);
  }

  std::unique_ptr<encoders::ImageAutoencoder> load_autoencoder(const encoders::EncoderSettings& settings) const override {
    return family_.encoders.load_image(folder_, settings);
  }

 private:
  // Memory admission of sampling, before any model loads: the largest transient of each stage must
  // fit what the device has. Denoising without a fused attention kernel (LibTorch < 2.1) holds one
  // attention's score matrix and its softmax (heads x tokens^2 in float32); decoding holds the
  // autoencoder's peak. (--width 16384 wanted 160 GB in one allocation before.)
  void admit(const sample::PipelineOptions& options, const std::vector<sample::SampleRequest>& requests,
             int64_t tokens_per_side_divisor) const {
    const int64_t available = memory::available_bytes(options.device) - memory::current_bytes(options.device);
    const int64_t heads = family_.attention_layers ? family_.attention_layers(spec_).heads : 0;
    for (const auto& r : requests) {
      const auto& s = r.settings;
      const std::string size = std::to_string(s.width) + " x " + std::to_string(s.height);
      const bool tiled = options.vae_tiling_above == 0 || std::max(s.width, s.height) > options.vae_tiling_above;
      const int64_t decode = family_.encoders.image_peak_bytes(folder_, s.width, s.height, options.dtype, tiled);
      if (decode > available) {
        throw_value_error("[memory] decoding a " + size + " picture needs about " + memory::format_bytes(decode) +
                          "; this machine has " + memory::format_bytes(available) +
                          " available: lower --width/--height or --vae_tiling_above");
      }
      if (!build_info().fused_attention && heads > 0) {
        double tokens = static_cast<double>(s.width / tokens_per_side_divisor) *
                            static_cast<double>(s.height / tokens_per_side_divisor) +
                        static_cast<double>(options.max_sequence_length);
        if (edits_pictures_ && r.image) {  // Kontext appends the input picture's tokens
          const auto info = image::read_image_info(*r.image);
          const auto in = sample::kontext_input_size(info.width, info.height, tokens_per_side_divisor,
                                                     options.image_auto_resize);
          tokens += static_cast<double>(in.width / tokens_per_side_divisor) *
                    static_cast<double>(in.height / tokens_per_side_divisor);
        }
        const double scores = 2.0 * static_cast<double>(heads) * tokens * tokens * 4;
        if (scores > static_cast<double>(available)) {
          throw_value_error("[memory] denoising a " + size + " picture needs about " +
                            memory::format_bytes(scores >= 9e18 ? INT64_MAX : static_cast<int64_t>(scores)) +
                            " for one attention's scores (" + std::to_string(heads) + " heads x " +
                            std::to_string(static_cast<int64_t>(tokens)) + "^2 tokens, float32, without LibTorch "
                            "2.0's fused attention); this machine has " + memory::format_bytes(available) +
                            " available: lower --width/--height");
        }
      }
    }
  }

  const ModelFamily& family_;
  encoders::PipelineFolder folder_;
  std::string flavour_;
  TransformerSpec spec_;
  sample::FlowMatchSchedulerConfig scheduler_;
  int64_t vae_scale_factor_ = 1;
  bool edits_pictures_ = false;  // a FLUX.1 Kontext pipeline (ModelFamily::picture_editing_pipeline_classes)
};

}  // namespace

const ModelFamily& family_of_pipeline(const std::string& folder) {
  const std::string cls = encoders::pipeline_class(folder);
  std::vector<std::string> known;
  for (const ModelFamily* family : model_families()) {
    for (const auto& name : family->pipeline_classes) {
      if (name == cls) return *family;
      known.push_back(name);
    }
  }
  throw_value_error("[sample] '" + folder + "' is a " + cls + " folder; remat samples " +
                    (known.empty() ? std::string("no pipeline") : detail::join(known, ", ")) + " folders");
}

std::unique_ptr<FamilyPipeline> make_text_to_image(const ModelFamily& family, const std::string& folder,
                                                   const std::string& flavour, const TransformerSpec* transformer,
                                                   const std::string& variant) {
  if (!family.samples()) {
    throw_value_error("[sample] model_family '" + family.name + "' (" + family.display_name +
                      ") has no encoders or scheduler in remat: it trains from latent caches, but cannot render "
                      "pictures");
  }
  std::vector<std::string> components = family.encoders.components();
  if (transformer == nullptr) components.push_back("transformer");
  // Without a flavour to pick a published scheduler by, the folder must have its own.
  if (flavour.empty()) components.push_back("scheduler");
  return std::make_unique<FamilyTextToImage>(family, family.encoders.open(folder, components, variant), flavour,
                                             transformer);
}

std::unique_ptr<Transformer> load_transformer_with_loras(const TransformerSpec& spec,
                                                         const std::vector<models::LoraFile>& loras,
                                                         const std::vector<sample::LoraSpec>& specs) {
  if (loras.size() != specs.size()) {
    throw_value_error("[sample] " + std::to_string(loras.size()) + " LoRA files but " + std::to_string(specs.size()) +
                      " LoRA scales");
  }
  auto model = make_transformer(spec, at::Device(at::kCPU));
  // Merged on the CPU, in float32 per module and rounded once to the weights' dtype.
  for (size_t i = 0; i < loras.size(); ++i) models::merge_lora(model->module(), loras[i], specs[i].scale);
  model->module().eval();
  return model;
}

std::vector<at::Tensor> run_text_to_image(const sample::PipelineOptions& options,
                                          const std::vector<sample::SampleRequest>& requests,
                                          const sample::PipelineEvents& events) {
  sample::check_requests(requests);
  const auto pipeline = make_text_to_image(family_of_pipeline(options.folder), options.folder, "", nullptr,
                                           options.variant);
  return sample::run_pipeline(*pipeline, options, requests, events);
}

}  // namespace remat::train
