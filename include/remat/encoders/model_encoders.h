#pragma once
/// \file
/// What a model family encodes with, seen from the code that runs the encoders without knowing the
/// family: the latent caches (remat/data/caches.h), `remat sample` and validation.
/// A family's text encoders turn a caption into the conditioning its transformer reads; its
/// autoencoder turns pictures into latents and back. A family hands out a FamilyEncoders (Flux's:
/// flux_family_encoders(), remat/encoders/flux_encoders.h) through its descriptor
/// (remat/train/family/family.h); the callers load what they need from a diffusers pipeline folder.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <ATen/core/Generator.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>

#include "remat/encoders/pipeline_folder.h"
#include "remat/export.h"

namespace remat::encoders {

/// How a family's encoders are loaded.
struct EncoderSettings {
  /// Weights and computation: bfloat16 (as the published files) or float32.
  at::ScalarType dtype = at::kBFloat16;
  /// Where they run (results come back to the CPU).
  at::Device device = at::kCPU;
  /// Text tokens per caption (SimpleTuner's tokenizer_max_length, FluxPipeline's max_sequence_length).
  int64_t max_sequence_length = 512;
  /// The model_flavour being trained or sampled (empty: the pipeline folder's own): families whose
  /// prompt encoding depends on it read it (MageFlow's edit flavours use another prompt template).
  std::string flavour = {};
};

/// How a family's pipeline turns a decoded picture into 8-bit pixels.
enum class PixelConversion {
  /// diffusers' VaeImageProcessor.postprocess: (x / 2 + 0.5).clamp(0, 1) * 255, rounded half to even.
  diffusers_postprocess,
  /// SimpleTuner's MageFlow pipeline (_tokens_to_image): x.clamp(-1, 1), 127.5 (x + 1) in the decoded
  /// picture's dtype, truncated to uint8.
  clamp_truncate,
};

/// One caption, encoded as the family's transformer reads it (a latent cache's text entry).
struct EncodedPrompt {
  at::Tensor prompt_embeds;         ///< (tokens, width), in the encoders' dtype
  at::Tensor pooled_prompt_embeds;  ///< (width), or undefined for families without a pooled vector
  /// What the tokenizers dropped (diffusers' truncation warnings).
  std::vector<std::string> warnings;
};

/// A family's text encoders, loaded.
class REMAT_API PromptEncoder {
 public:
  virtual ~PromptEncoder() = default;
  virtual EncodedPrompt encode_caption(const std::string& caption) = 0;
};

/// A family's autoencoder, loaded: pictures to the transformer's latent space and back.
class REMAT_API ImageAutoencoder {
 public:
  virtual ~ImageAutoencoder() = default;
  /// (1, 3, H, W) in [-1, 1] -> latents (C, H / f, W / f) in float32 on the CPU: the posterior's
  /// sample drawn from `generator`, or its mean without one.
  virtual at::Tensor encode_image(const at::Tensor& vae_input, c10::optional<at::Generator> generator) = 0;
  /// Latents (C, h, w) -> a decoded picture (1, 3, f h, f w), roughly in [-1, 1], on the CPU in the
  /// autoencoder's dtype (diffusers' VaeImageProcessor.postprocess clamps in that dtype).
  virtual at::Tensor decode_latents(const at::Tensor& latents) = 0;
  /// Works in tiles (diffusers' enable_tiling) from now on, or whole.
  virtual void set_tiling(bool tiled) = 0;
  /// f: pixels per latent pixel along each axis.
  virtual int64_t vae_scale_factor() const = 0;
  /// How its pipeline makes pixels of decode_latents' pictures (remat/sample/sampler.h to_uint8_image).
  virtual PixelConversion pixel_conversion() const { return PixelConversion::diffusers_postprocess; }
};

/// A family's encoders in a diffusers pipeline folder. Each function takes the folder opened with
/// (at least) the components it names.
struct REMAT_API FamilyEncoders {
  /// What the family's pipeline folders hold (model_index.json's classes and components).
  PipelineLayout layout;
  /// The folder components the text encoders and the autoencoder load from.
  std::vector<std::string> text_components;
  std::vector<std::string> image_components;
  /// Whether an encoded caption has a pooled vector (pooled_prompt_embeds).
  bool pooled = false;
  /// Datasets crop pictures to sides that are multiples of this (Flux: its published VAE's 8x
  /// downsampling times the transformer's 2x2 packing, 16).
  int64_t pixel_multiple = 16;
  std::function<std::unique_ptr<PromptEncoder>(const PipelineFolder&, const EncoderSettings&)> load_text;
  std::function<std::unique_ptr<ImageAutoencoder>(const PipelineFolder&, const EncoderSettings&)> load_image;
  /// What in an encoded caption depends on the flavour (MageFlow: its prompt template's name),
  /// for the identity of cached text embeddings. Unset: nothing does.
  std::function<std::string(const std::string& flavour)> prompt_style;
  /// f of the folder's autoencoder, from its config alone.
  std::function<int64_t(const PipelineFolder&)> vae_scale_factor;
  /// Memory admission from the configs alone: the bytes of the autoencoder's weights, and the
  /// bytes its activations hold at the peak of encoding or decoding one width x height picture.
  std::function<int64_t(const PipelineFolder&, at::ScalarType)> image_weight_bytes;
  std::function<int64_t(const PipelineFolder&, int64_t width, int64_t height, at::ScalarType, bool tiled)>
      image_peak_bytes;

  /// Whether the family has encoders at all (its latent caches are made elsewhere otherwise).
  bool available() const { return static_cast<bool>(load_text) && static_cast<bool>(load_image); }
  /// text_components and image_components together (for PipelineFolder::open).
  std::vector<std::string> components(bool text = true, bool image = true) const;
  /// PipelineFolder::open of `root` in this layout with `required` components (their weights of
  /// `variant`, when given).
  PipelineFolder open(const std::string& root, const std::vector<std::string>& required,
                      const std::string& variant = {}) const;
};

}  // namespace remat::encoders
