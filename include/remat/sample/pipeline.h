#pragma once
/// \file
/// Text to image with a diffusers Flux pipeline folder and any number of LoRAs (`remat sample`),
/// in FluxPipeline's order of work, each model in memory only while it is needed:
///   1. the text encoders (CLIP, T5) encode every prompt and negative prompt, then are freed;
///   2. the transformer is built from transformer/config.json, loaded (diffusers' or Black Forest
///      Labs' layout), the LoRAs are merged into its weights, and each request is denoised
///      (remat/sample/sampler.h) with the scheduler of scheduler/scheduler_config.json; then the
///      transformer is freed;
///   3. the VAE decodes every picture (in tiles when a side exceeds PipelineOptions::
///      vae_tiling_above) and the pixels are handed out one picture at a time.
/// Everything that can be checked without running a model (sizes, the folder's components, the
/// scheduler config, every LoRA file's format and its fit to the transformer's shapes) is checked
/// before the first model loads, so bad input fails in seconds and before any output.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "remat/export.h"
#include "remat/models/quantization.h"
#include "remat/models/flux.h"
#include "remat/models/lora_formats.h"
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
  std::string folder;  ///< the diffusers Flux pipeline folder (model_index.json)
  std::vector<LoraSpec> loras;
  /// Weights and computation of every model: bfloat16 (as the published files) or float32.
  at::ScalarType dtype = at::kBFloat16;
  /// Where the text encoders, the transformer and the VAE run (one after the other).
  c10::Device device = c10::kCPU;
  /// T5 tokens per prompt (FluxPipeline's max_sequence_length: 512 for dev, 256 for schnell).
  int64_t max_sequence_length = 512;
  /// The VAE decodes in tiles (diffusers' enable_tiling, its tile size from vae/config.json's
  /// sample_size) when the picture's width or height exceeds this many pixels; below it the
  /// decode is whole, as diffusers' default. 0: always tiled.
  int64_t vae_tiling_above = 1024;
  /// The transformer's base weights (SimpleTuner's base_model_precision, parsed by
  /// models::parse_base_model_precision): quantised as they stream from the file, so the
  /// full-precision transformer is never held (remat/models/quantized_loading.h).
  models::BasePrecision base_model_precision;
};

/// One picture to make.
struct SampleRequest {
  std::string prompt;
  /// Used only when settings.true_cfg_scale > 1 (an empty string is a negative prompt too, as
  /// in diffusers); unset: no true CFG.
  std::optional<std::string> negative_prompt;
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

/// Checks `requests` (sizes positive multiples of 16, steps >= 1, ...) without loading anything.
/// Throws c10::ValueError naming the request and the value.
REMAT_API void check_requests(const std::vector<SampleRequest>& requests);

/// The LoRA files of `loras`, read, each checked against the Linear layers `config` defines
/// (module names and factor shapes, from the config alone): a file for another model shape is a
/// c10::ValueError naming the file, the module and both shapes, before any model is built.
REMAT_API std::vector<models::LoraFile> read_loras_for(const std::vector<LoraSpec>& loras,
                                                       const models::FluxConfig& config);

/// Builds the Flux transformer of a pipeline folder's transformer/ directory directly in `dtype`
/// (no float32 copy of a bf16 model), loads its weights strictly (diffusers' or Black Forest
/// Labs' layout), merges `loras` (with their specs' scales, in order) and moves it to `device`,
/// in eval mode. With a quantising `precision` the block Linears are quantised while they load
/// (never held in full precision) and a LoRA is merged into each one's dequantised weight, which
/// is then quantised again.
REMAT_API models::Flux load_transformer_with_loras(const std::string& transformer_dir, at::ScalarType dtype,
                                                   c10::Device device, const std::vector<models::LoraFile>& loras,
                                                   const std::vector<LoraSpec>& specs,
                                                   const models::BasePrecision& precision = {});

/// The whole text-to-image run (see the file comment). Returns the pictures, uint8 (H, W, 3), in
/// request order (also handed to events.on_image as each is decoded).
REMAT_API std::vector<at::Tensor> run_pipeline(const PipelineOptions& options,
                                               const std::vector<SampleRequest>& requests,
                                               const PipelineEvents& events = {});

}  // namespace remat::sample
