// MageFlow's pipeline folder and encoders (remat/encoders/mageflow_encoders.h), after SimpleTuner's
// mageflow/model.py (TEXT_ENCODER_CONFIGURATION, AUTOENCODER_CLASS, _encode_prompts), pipeline.py
// (encode_prompt, _tokens_to_image) and autoencoder.py (MageVAE.from_pretrained) at bc8e6ab7.
#include "remat/encoders/mageflow_encoders.h"

#include <algorithm>
#include <filesystem>

#include <torch/torch.h>

#include "remat/encoders/mageflow_text_encoder.h"
#include "remat/memory.h"
#include "remat/models/component_weights.h"
#include "remat/util/error.h"

namespace remat::encoders {
namespace {

namespace fs = std::filesystem;

std::string component_file(const std::string& dir, const char* name) { return (fs::path(dir) / name).string(); }

// Weights are built in host memory first: refuse a component that cannot fit before building it.
void admit_component(const PipelineFolder& folder, const char* component, int64_t parameters, at::ScalarType dtype) {
  const int64_t need = parameters * static_cast<int64_t>(c10::elementSize(dtype));
  const c10::Device cpu(c10::kCPU);
  const int64_t available = memory::available_bytes(cpu) - memory::current_bytes(cpu);
  if (need > available) {
    throw_value_error("[memory] loading " + std::string(component) + "/ of '" + folder.root + "' in " +
                      c10::toString(dtype) + " needs " + memory::format_bytes(need) + " for its weights; this machine has " +
                      memory::format_bytes(available) + " available" +
                      (dtype == at::kFloat ? std::string(": use bfloat16 (--mixed_precision=bf16, --dtype=bf16)")
                                           : std::string()));
  }
}

void check_encoder_dtype(at::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    throw_value_error(std::string("[pipeline] encoder dtype must be float32 or bfloat16, got ") + c10::toString(dtype));
  }
}

class MageFlowPromptEncoder final : public PromptEncoder {
 public:
  MageFlowPromptEncoder(MageFlowTextEncoder encoder, int64_t max_sequence_length, bool edit)
      : encoder_(std::move(encoder)), max_sequence_length_(max_sequence_length), edit_(edit) {}

  EncodedPrompt encode_caption(const std::string& caption) override {
    EncodedPrompt out;
    out.prompt_embeds = encoder_.encode(caption, max_sequence_length_, edit_);
    // encode_prompt truncates silently; say what was dropped, as the Flux encoders do.
    const auto& t = mageflow_prompt_template(edit_);
    const auto full = encoder_.tokenizer().encode(t.apply(caption));
    const int64_t limit = max_sequence_length_ + t.start_idx;
    if (static_cast<int64_t>(full.size()) > limit) {
      out.warnings.push_back("[mageflow] the caption's " + std::to_string(full.size() - t.start_idx) +
                             " tokens were cut to tokenizer_max_length " + std::to_string(max_sequence_length_) +
                             " (the end of the caption and of the chat template are dropped)");
    }
    return out;
  }

 private:
  MageFlowTextEncoder encoder_;
  int64_t max_sequence_length_;
  bool edit_;
};

class MageVaeAutoencoder final : public ImageAutoencoder {
 public:
  MageVaeAutoencoder(MageVae vae, at::ScalarType dtype, at::Device device)
      : vae_(std::move(vae)), dtype_(dtype), device_(device) {}

  at::Tensor encode_image(const at::Tensor& vae_input, c10::optional<at::Generator>) override {
    const int64_t f = vae_scale_factor();
    if (vae_input.dim() != 4 || vae_input.size(0) != 1 || vae_input.size(1) != 3) {
      throw_value_error("[pipeline] encode_image takes one image (1, 3, H, W), got " + c10::str(vae_input.sizes()));
    }
    if (vae_input.size(2) % f != 0 || vae_input.size(3) % f != 0) {
      throw_value_error("[pipeline] image height and width must be multiples of " + std::to_string(f) +
                        " (Mage-VAE's patch size), got " + std::to_string(vae_input.size(3)) + " x " +
                        std::to_string(vae_input.size(2)));
    }
    torch::NoGradGuard no_grad;
    // The posterior mean, unscaled (AUTOENCODER_SCALING_FACTOR 1.0, sample_posterior False).
    return vae_.encode(vae_input.to(device_, dtype_)).to(at::kCPU, at::kFloat).squeeze(0).contiguous();
  }

  at::Tensor decode_latents(const at::Tensor& latents) override {
    const int64_t channels = vae_.config().latent_channels;
    if (latents.dim() != 3 || latents.size(0) != channels) {
      throw_value_error("[pipeline] decode_latents takes latents (" + std::to_string(channels) + ", h, w), got " +
                        c10::str(latents.sizes()));
    }
    torch::NoGradGuard no_grad;
    return vae_.decode(latents.unsqueeze(0).to(device_, dtype_)).to(at::kCPU);
  }

  // Mage-VAE decodes windowed already; upstream has no tiled decode.
  void set_tiling(bool) override {}
  int64_t vae_scale_factor() const override { return vae_.config().patch_size; }
  PixelConversion pixel_conversion() const override { return PixelConversion::clamp_truncate; }

 private:
  MageVae vae_;
  at::ScalarType dtype_;
  at::Device device_;
};

}  // namespace

const PipelineLayout& mageflow_pipeline_layout() {
  static const PipelineLayout layout = {
      {"MageFlowPipeline", "MageFlowEditPipeline"},
      "remat reads MageFlow pipeline folders",
      {
          {"scheduler", "diffusers", {"FlowMatchEulerDiscreteScheduler"}, "scheduler_config.json", false},
          // The tokenizer lives here too (SimpleTuner's tokenizer_subfolder is text_encoder).
          {"text_encoder", "transformers", {"Qwen3VLForConditionalGeneration"}, "config.json", true,
           "_text_encoder_path"},
          {"transformer", "diffusers", {"MageFlowTransformer2DModel"}, "config.json", true},
          // MageVAE.from_pretrained reads diffusion_pytorch_model.safetensors alone.
          {"vae", "diffusers", {"MageVAE"}, "diffusion_pytorch_model.safetensors", true, "_vae_source"},
      }};
  return layout;
}

bool mageflow_uses_edit_template(const std::string& flavour, const std::string& pipeline_class) {
  if (!flavour.empty()) return flavour == "edit-base" || flavour == "edit" || flavour == "edit-turbo";
  return pipeline_class == "MageFlowEditPipeline";
}

MageVaeConfig mage_vae_config_of(const PipelineFolder& folder) {
  const std::string path = component_file(folder.directory("vae"), "config.json");
  std::error_code ec;
  return fs::is_regular_file(path, ec) ? MageVaeConfig::from_json_file(path) : MageVaeConfig{};
}

Qwen3TextConfig mageflow_text_config_of(const PipelineFolder& folder) {
  return Qwen3TextConfig::from_json_file(component_file(folder.directory("text_encoder"), "config.json"));
}

int64_t mage_vae_peak_bytes(const MageVaeConfig& config, int64_t width, int64_t height, int64_t element_bytes) {
  config.validate();
  const double pixels = static_cast<double>(width) * static_cast<double>(height);
  const double latent = pixels / static_cast<double>(config.patch_size * config.patch_size);
  // Per pixel: the head's input (3 + hidden_size_x + 64 position channels), its conditioning and
  // a few hidden_size_x-wide temporaries alive at once; per latent pixel: the DiCo blocks'
  // 4x-wide feed-forward and the CoD decoder's few hidden_size-wide maps. One window's attention
  // scores (window^2 tokens squared, float32 softmax) on top. A bfloat16 model still makes some
  // float32 temporaries (its norms): counted at 3 bytes an element. Checked against the
  // peak-tracking allocator in tests/encoders/mageflow_encoders_test.cpp (float32 and bfloat16).
  const double per_pixel = static_cast<double>(3 + 64 + 8 * config.hidden_size_x);
  const double per_latent = static_cast<double>(config.hidden_size) * (config.mlp_ratio + 6.0);
  const double window = static_cast<double>(config.attention_window * config.attention_window);
  const double scores = 2.0 * window * window * 4.0;
  const double bytes = static_cast<double>(std::max<int64_t>(element_bytes, 3));
  return static_cast<int64_t>((pixels * per_pixel + latent * per_latent) * bytes + scores);
}

FamilyEncoders mageflow_family_encoders() {
  FamilyEncoders f;
  f.layout = mageflow_pipeline_layout();
  f.text_components = {"text_encoder"};
  f.image_components = {"vae"};
  f.pooled = false;       // MageFlow's transformer reads the text states alone
  f.pixel_multiple = 16;  // Mage-VAE's 16x16 patches, one token per latent pixel (mageflow/model.py: alignment 16)
  f.load_text = [](const PipelineFolder& folder, const EncoderSettings& settings) -> std::unique_ptr<PromptEncoder> {
    check_encoder_dtype(settings.dtype);
    if (settings.max_sequence_length < 1) {
      throw_value_error("[pipeline] tokenizer_max_length must be at least 1, got " +
                        std::to_string(settings.max_sequence_length));
    }
    const auto config = mageflow_text_config_of(folder);
    admit_component(folder, "text_encoder", config.parameter_count(), settings.dtype);
    const std::string& dir = folder.directory("text_encoder");
    auto encoder = MageFlowTextEncoder::load(dir, settings.dtype, settings.device, folder.variant);
    const bool edit = mageflow_uses_edit_template(settings.flavour, pipeline_class(folder.root));
    return std::make_unique<MageFlowPromptEncoder>(std::move(encoder), settings.max_sequence_length, edit);
  };
  f.load_image = [](const PipelineFolder& folder,
                    const EncoderSettings& settings) -> std::unique_ptr<ImageAutoencoder> {
    check_encoder_dtype(settings.dtype);
    const auto config = mage_vae_config_of(folder);
    admit_component(folder, "vae", config.parameter_count(), settings.dtype);
    const auto files = models::open_component_weights(folder.directory("vae"), folder.variant);
    return std::make_unique<MageVaeAutoencoder>(MageVae::load(files, config, settings.dtype, settings.device),
                                                settings.dtype, settings.device);
  };
  f.prompt_style = [](const std::string& flavour) {
    return mageflow_prompt_template(mageflow_uses_edit_template(flavour, "")).name;
  };
  f.vae_scale_factor = [](const PipelineFolder& folder) { return mage_vae_config_of(folder).patch_size; };
  f.image_weight_bytes = [](const PipelineFolder& folder, at::ScalarType dtype) {
    return mage_vae_config_of(folder).parameter_count() * static_cast<int64_t>(c10::elementSize(dtype));
  };
  f.image_peak_bytes = [](const PipelineFolder& folder, int64_t width, int64_t height, at::ScalarType dtype, bool) {
    return mage_vae_peak_bytes(mage_vae_config_of(folder), width, height, static_cast<int64_t>(c10::elementSize(dtype)));
  };
  return f;
}

}  // namespace remat::encoders
