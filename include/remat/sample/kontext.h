#pragma once
/// \file
/// FLUX.1 Kontext's picture sizes, as diffusers' FluxKontextPipeline.__call__ computes them
/// (pipelines/flux/pipeline_flux_kontext.py, diffusers 0.42.1): the size of the picture it makes
/// (the requested aspect ratio at `max_area` pixels) and the size the input picture is resized to
/// before the VAE encodes it (the preferred Kontext resolution nearest its aspect ratio). The
/// denoising loop that appends the input picture's latents is sample::denoise's
/// (SamplingSettings::reference_latents).

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "remat/export.h"

namespace remat::sample {

struct PictureSize {
  int64_t width = 0;
  int64_t height = 0;
  bool operator==(const PictureSize& o) const { return width == o.width && height == o.height; }
};

/// FluxKontextPipeline's PREFERRED_KONTEXT_RESOLUTIONS, (width, height): the sizes Kontext was
/// trained at, about one megapixel each.
REMAT_API const std::vector<PictureSize>& preferred_kontext_resolutions();

/// The picture FluxKontextPipeline makes when asked for `width` x `height`: the same aspect ratio
/// at `max_area` pixels (width = round(sqrt(max_area * w / h)), height = round(sqrt(max_area * h /
/// w)), Python's round), each side floored to a multiple of `multiple` (2 x the VAE's factor).
/// Throws c10::ValueError naming the value for sizes or an area below 1.
REMAT_API PictureSize kontext_output_size(int64_t width, int64_t height, int64_t max_area, int64_t multiple);

/// The size an input picture of `width` x `height` is resized to: its sides floored to
/// `multiple` (VaeImageProcessor.get_default_height_width), then with `auto_resize` the preferred
/// resolution whose aspect ratio is nearest (ties: the narrower), floored to `multiple` again.
/// Throws c10::ValueError when a side is below `multiple`.
REMAT_API PictureSize kontext_input_size(int64_t width, int64_t height, int64_t multiple, bool auto_resize);

/// uint8 [H, W, 3] -> the VAE's input (1, 3, h, w) in [-1, 1] at `size`: PIL's Lanczos resize
/// (VaeImageProcessor.resize) then x / 127.5 - 1 (VaeImageProcessor.preprocess, normalised).
REMAT_API at::Tensor kontext_vae_input(const at::Tensor& picture, const PictureSize& size);

}  // namespace remat::sample
