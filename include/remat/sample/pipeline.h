#pragma once
/// \file
/// Text to image with a diffusers pipeline folder and any number of LoRAs (`remat sample`), in
/// diffusers' order of work (FluxPipeline.__call__), each model in memory only while it is needed:
///   1. the text encoders encode every prompt and negative prompt, then are freed; a Kontext
///      pipeline's autoencoder then encodes the requests' input pictures, and is freed;
///   2. the transformer is built from transformer/config.json, loaded, the LoRAs are merged into
///      its weights, and each request is denoised (remat/sample/sampler.h Denoiser) with the
///      pipeline's scheduler; then the transformer is freed;
///   3. the autoencoder decodes every picture (in tiles when a side exceeds PipelineOptions::
///      vae_tiling_above) and the pixels are handed out one picture at a time.
/// The model family supplies each part through a TextToImage (remat/train/family/text_to_image.h makes
/// one for any registered family); run_pipeline only orders the work. Everything that can be
/// checked without running a model (sizes, the folder's components, the scheduler config, every
/// LoRA file's format and its fit to the transformer's shapes, memory) is checked before the first
/// model loads, so bad input fails in seconds and before any output.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "remat/encoders/model_encoders.h"
#include "remat/export.h"
#include "remat/models/lora.h"
#include "remat/models/lora_formats.h"
#include "remat/models/quantization.h"
#include "remat/sample/sampler.h"

namespace remat::sample {

/// One LoRA merged into the transformer's weights: delta W times `scale` (0: the base model).
struct LoraSpec {
  std::string path;  ///< a safetensors file in any format models::read_lora_file reads
  double scale = 1.0;
};

/// `--lora PATH[:SCALE]`: the text after the last ':' is the scale when it is a finite number,
/// otherwise the whole text is the path (scale 1). Throws c10::ValueError for an empty path.
REMAT_API LoraSpec parse_lora_spec(const std::string& text);

struct PipelineOptions {
  std::string folder;  ///< the diffusers pipeline folder (model_index.json)
  /// The weights variant every component is read in (models::find_component_weights); empty: plain.
  std::string variant;
  std::vector<LoraSpec> loras;
  /// Weights and computation of every model: bfloat16 (as the published files) or float32.
  at::ScalarType dtype = at::kBFloat16;
  /// Where the text encoders, the transformer and the VAE run (one after the other).
  c10::Device device = c10::kCPU;
  /// Text tokens per prompt (FluxPipeline's max_sequence_length: T5's, 512 for dev, 256 for schnell).
  int64_t max_sequence_length = 512;
  /// The VAE decodes in tiles (diffusers' enable_tiling, its tile size from vae/config.json's
  /// sample_size) when the picture's width or height exceeds this many pixels; below it the
  /// decode is whole, as diffusers' default. 0: always tiled.
  int64_t vae_tiling_above = 1024;
  /// The transformer's base weights (SimpleTuner's base_model_precision, parsed by
  /// models::parse_base_model_precision): quantised as they stream from the file, so the
  /// full-precision transformer is never held (remat/models/quantized_loading.h).
  models::BasePrecision base_model_precision;
  /// FLUX.1 Kontext pipelines (TextToImage::edits_pictures): every picture is made at the
  /// requested aspect ratio with this many pixels (FluxKontextPipeline's max_area, 1024^2).
  int64_t max_area = 1024 * 1024;
  /// FLUX.1 Kontext: an input picture is resized to the preferred Kontext resolution nearest its
  /// aspect ratio (FluxKontextPipeline's _auto_resize); false: to its own size floored to 2 f.
  bool image_auto_resize = true;
};

/// One picture to make.
struct SampleRequest {
  std::string prompt;
  /// Used only when settings.true_cfg_scale > 1 (an empty string is a negative prompt too, as
  /// in diffusers); unset: no true CFG.
  std::optional<std::string> negative_prompt;
  /// A picture to edit (FLUX.1 Kontext pipelines only): its VAE latents condition every step
  /// (SamplingSettings::reference_latents). Unset: none.
  std::optional<std::string> image;
  SamplingSettings settings;
};

/// What run_pipeline reports while it works.
struct PipelineEvents {
  /// A stage starts or ends ("encoding 3 prompts", "loading the transformer", ...), one line.
  std::function<void(const std::string&)> on_stage;
  /// After each denoising step of request `index`.
  std::function<void(size_t index, int64_t step, int64_t steps)> on_step;
  /// A picture is ready: uint8 (H, W, 3) on the CPU for request `index` (in request order).
  std::function<void(size_t index, const at::Tensor& pixels)> on_image;
  /// Warnings (a truncated prompt, parts of a LoRA file that were dropped).
  std::function<void(const std::string&)> on_warning;
};

/// The LoRA file `--lora PATH` means: a file as it is; a folder (or a Hugging Face model id found
/// in the local hub cache at `revision`, remat/io/hub_cache.h) its LoRA file as diffusers'
/// load_lora_weights guesses it: pytorch_lora_weights.safetensors, else the one top-level
/// .safetensors file (without scheduler, optimizer or checkpoint in its name). Several candidates,
/// or none, are a c10::ValueError naming them. `resolved_from`, when given, is set to a line
/// naming the id, revision, commit and snapshot for a hub id (left alone otherwise).
REMAT_API std::string lora_file_of(const std::string& path_or_id, const std::string& revision = "main",
                                   std::string* resolved_from = nullptr);

/// Checks `requests` (sizes positive and bounded, steps >= 1, ...) without loading anything; the
/// multiple each size must be of is the family's (TextToImage::check).
/// Throws c10::ValueError naming the request and the value.
REMAT_API void check_requests(const std::vector<SampleRequest>& requests);

/// The LoRA files of `loras`, read, each checked against the Linear layers of the transformer
/// (`layers`: module names and shapes, from its config alone: ModelFamily::linear_layers): a file
/// for another model shape is a c10::ValueError naming the file, the module and both shapes,
/// before any model is built.
REMAT_API std::vector<models::LoraFile> read_loras_for(const std::vector<LoraSpec>& loras,
                                                       const std::vector<models::LinearShape>& layers);

/// One model family's text-to-image parts over one pipeline folder: what run_pipeline needs from
/// the family, each model loaded only when asked for.
class REMAT_API TextToImage {
 public:
  virtual ~TextToImage() = default;
  /// f of the pipeline's autoencoder: pixels per latent pixel (SamplingSettings::vae_scale_factor).
  virtual int64_t vae_scale_factor() const = 0;
  /// Whether the pipeline edits pictures as FLUX.1 Kontext's does (a request's image; its sizes by
  /// kontext_output_size, remat/sample/kontext.h).
  virtual bool edits_pictures() const { return false; }
  /// Checks, before any model loads, what only the family knows: the options (dtype,
  /// max_sequence_length), each request's size against the family's latent grid, and that the
  /// largest transient of each stage fits the memory the device has. Throws c10::ValueError
  /// naming the value.
  virtual void check(const PipelineOptions& options, const std::vector<SampleRequest>& requests) const = 0;
  /// read_loras_for with the transformer's Linear layers.
  virtual std::vector<models::LoraFile> read_loras(const std::vector<LoraSpec>& loras) const = 0;
  /// The text encoders, in settings.dtype on settings.device.
  virtual std::unique_ptr<encoders::PromptEncoder> load_prompt_encoder(
      const encoders::EncoderSettings& settings) const = 0;
  /// The transformer, built directly in settings.dtype (no float32 copy of a bf16 model), its
  /// weights loaded strictly, `loras` merged with their specs' scales in order, on settings.device
  /// in eval mode, with the pipeline's scheduler. With a quantising `precision` the base Linears
  /// are quantised while they load and a LoRA is merged into each one's dequantised weight.
  virtual std::unique_ptr<Denoiser> load_denoiser(const encoders::EncoderSettings& settings,
                                                  const std::vector<models::LoraFile>& loras,
                                                  const std::vector<LoraSpec>& specs,
                                                  const models::BasePrecision& precision) const = 0;
  /// The autoencoder, in settings.dtype on settings.device.
  virtual std::unique_ptr<encoders::ImageAutoencoder> load_autoencoder(
      const encoders::EncoderSettings& settings) const = 0;
};

/// The whole text-to-image run (see the file comment). Returns the pictures, uint8 (H, W, 3), in
/// request order (also handed to events.on_image as each is decoded).
REMAT_API std::vector<at::Tensor> run_pipeline(const TextToImage& pipeline, const PipelineOptions& options,
                                               const std::vector<SampleRequest>& requests,
                                               const PipelineEvents& events = {});

}  // namespace remat::sample
