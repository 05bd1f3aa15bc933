#include "remat/sample/kontext.h"

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "remat/image/image_file.h"
#include "remat/util/error.h"

namespace remat::sample {

const std::vector<PictureSize>& preferred_kontext_resolutions() {
  // pipeline_flux_kontext.py, PREFERRED_KONTEXT_RESOLUTIONS.
  static const std::vector<PictureSize> sizes = {
      {672, 1568}, {688, 1504}, {720, 1456}, {752, 1392}, {800, 1328}, {832, 1248},
      {880, 1184}, {944, 1104}, {1024, 1024}, {1104, 944}, {1184, 880}, {1248, 832},
      {1328, 800}, {1392, 752}, {1456, 720}, {1504, 688}, {1568, 672}};
  return sizes;
}

PictureSize kontext_output_size(int64_t width, int64_t height, int64_t max_area, int64_t multiple) {
  if (width < 1 || height < 1 || max_area < 1 || multiple < 1) {
    throw_value_error("[sample] Kontext sizes must be positive, got " + std::to_string(width) + " x " +
                      std::to_string(height) + " at max_area " + std::to_string(max_area));
  }
  // aspect_ratio = width / height; width = round((max_area * aspect_ratio) ** 0.5): Python's
  // round, halves to even, which nearbyint does in the default rounding mode.
  const double aspect = static_cast<double>(width) / static_cast<double>(height);
  const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(static_cast<double>(max_area) * aspect)));
  const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(static_cast<double>(max_area) / aspect)));
  PictureSize out{w / multiple * multiple, h / multiple * multiple};
  if (out.width < multiple || out.height < multiple) {
    throw_value_error("[sample] max_area " + std::to_string(max_area) + " at the aspect ratio of " +
                      std::to_string(width) + " x " + std::to_string(height) + " leaves a side below " +
                      std::to_string(multiple) + " pixels: raise --max_area");
  }
  return out;
}

PictureSize kontext_input_size(int64_t width, int64_t height, int64_t multiple, bool auto_resize) {
  // VaeImageProcessor(vae_scale_factor=2 f).get_default_height_width: x - x % (2 f).
  const int64_t w = width - width % multiple, h = height - height % multiple;
  if (w < multiple || h < multiple) {
    throw_value_error("[sample] the input picture is " + std::to_string(width) + " x " + std::to_string(height) +
                      ": each side must be at least " + std::to_string(multiple) + " pixels");
  }
  if (!auto_resize) return {w, h};
  const double aspect = static_cast<double>(w) / static_cast<double>(h);
  // min((abs(aspect_ratio - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
  std::tuple<double, int64_t, int64_t> best{std::numeric_limits<double>::infinity(), 0, 0};
  for (const auto& r : preferred_kontext_resolutions()) {
    const std::tuple<double, int64_t, int64_t> candidate{
        std::abs(aspect - static_cast<double>(r.width) / static_cast<double>(r.height)), r.width, r.height};
    if (candidate < best) best = candidate;
  }
  return {std::get<1>(best) / multiple * multiple, std::get<2>(best) / multiple * multiple};
}

at::Tensor kontext_vae_input(const at::Tensor& picture, const PictureSize& size) {
  // PIL's resize returns a copy at the same size; resize_picture then only copies too.
  const bool same = picture.size(1) == size.width && picture.size(0) == size.height;
  return image::picture_to_vae_input(same ? picture : image::resize_picture(picture, size.width, size.height));
}

}  // namespace remat::sample
