// Resizing and cropping pictures. The resampling follows PIL's Image.resize for 8-bit pictures
// (Resample.c), so a bucketed picture is the one SimpleTuner would train on: a separable filter
// whose support widens by the shrink factor (antialiasing), weights normalised per output pixel
// and rounded to 22-bit fixed point, the horizontal pass first with its result rounded and clamped
// to 8 bits, then the vertical pass. The filter formulas are PIL's (bicubic with a = -0.5,
// Lanczos with three lobes).
#include <cmath>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

#include "remat/image/image_file.h"
#include "remat/util/error.h"

namespace remat::image {
namespace {

constexpr int kFixedPointBits = 22;  // PIL's PRECISION_BITS for 8-bit pictures: 32 - 8 - 2

double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}

double lanczos3(double x) { return (x >= -3.0 && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0; }

// For each output position along one axis: the first input position it reads, how many, and
// their fixed-point weights (taps per output position, unused ones zero).
struct AxisWeights {
  int64_t taps = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> weights;
};

AxisWeights axis_weights(int64_t in_size, int64_t out_size, ResampleFilter filter) {
  const double support_1 = filter == ResampleFilter::lanczos ? 3.0 : 2.0;
  double (*kernel)(double) = filter == ResampleFilter::lanczos ? &lanczos3 : &bicubic;
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double stretch = std::max(scale, 1.0);  // shrinking widens the filter: antialiasing
  const double support = support_1 * stretch;
  const double inverse_stretch = 1.0 / stretch;
  AxisWeights axis;
  axis.taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  axis.first.resize(out_size);
  axis.count.resize(out_size);
  axis.weights.assign(out_size * axis.taps, 0);
  std::vector<double> w(axis.taps);
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    const int64_t first = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t last = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size);
    double total = 0.0;
    for (int64_t i = first; i < last; ++i) {
      w[i - first] = kernel((static_cast<double>(i) - center + 0.5) * inverse_stretch);
      total += w[i - first];
    }
    for (int64_t k = 0; k < last - first; ++k) {
      const double normalised = total != 0.0 ? w[k] / total : w[k];
      const double fixed = normalised * (1 << kFixedPointBits);
      axis.weights[o * axis.taps + k] = static_cast<int32_t>(fixed < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    axis.first[o] = first;
    axis.count[o] = last - first;
  }
  return axis;
}

uint8_t to_8_bits(int64_t sum) {
  const int64_t value = sum >> kFixedPointBits;  // sum starts at one half: this rounds
  return static_cast<uint8_t>(value < 0 ? 0 : value > 255 ? 255 : value);
}

// One pass along axis 1 (columns) of uint8 [rows, columns, channels].
at::Tensor resample_columns(const at::Tensor& in, int64_t out_columns, ResampleFilter filter) {
  const int64_t rows = in.size(0), columns = in.size(1), channels = in.size(2);
  const AxisWeights axis = axis_weights(columns, out_columns, filter);
  auto out = at::empty({rows, out_columns, channels}, at::kByte);
  const uint8_t* src = in.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* row = src + r * columns * channels;
      for (int64_t o = 0; o < out_columns; ++o) {
        const int32_t* w = axis.weights.data() + o * axis.taps;
        for (int64_t c = 0; c < channels; ++c) {
          int64_t sum = int64_t{1} << (kFixedPointBits - 1);
          for (int64_t k = 0; k < axis.count[o]; ++k) sum += int64_t{row[(axis.first[o] + k) * channels + c]} * w[k];
          dst[(r * out_columns + o) * channels + c] = to_8_bits(sum);
        }
      }
    }
  });
  return out;
}

// One pass along axis 0 (rows).
at::Tensor resample_rows(const at::Tensor& in, int64_t out_rows, ResampleFilter filter) {
  const int64_t rows = in.size(0), row_values = in.size(1) * in.size(2);
  const AxisWeights axis = axis_weights(rows, out_rows, filter);
  auto out = at::empty({out_rows, in.size(1), in.size(2)}, at::kByte);
  const uint8_t* src = in.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, out_rows, 4, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> sums(row_values);
    for (int64_t o = begin; o < end; ++o) {
      const int32_t* w = axis.weights.data() + o * axis.taps;
      std::fill(sums.begin(), sums.end(), int64_t{1} << (kFixedPointBits - 1));
      for (int64_t k = 0; k < axis.count[o]; ++k) {
        const uint8_t* row = src + (axis.first[o] + k) * row_values;
        for (int64_t v = 0; v < row_values; ++v) sums[v] += int64_t{row[v]} * w[k];
      }
      for (int64_t v = 0; v < row_values; ++v) dst[o * row_values + v] = to_8_bits(sums[v]);
    }
  });
  return out;
}

void check_resize_input(const at::Tensor& picture, const char* what) {
  if (picture.dim() != 3 || picture.scalar_type() != at::kByte || picture.size(0) < 1 || picture.size(1) < 1) {
    throw_value_error(std::string("[image] ") + what + " needs a non-empty uint8 [height, width, channels] tensor, got " +
                      std::string(c10::toString(picture.scalar_type())) + " of size " + c10::str(picture.sizes()));
  }
}

}  // namespace

at::Tensor resize_picture(const at::Tensor& picture, int64_t width, int64_t height, ResampleFilter filter) {
  check_resize_input(picture, "resize_picture");
  if (width < 1 || height < 1 || width > kMaxImagePixels || height > kMaxImagePixels ||
      width * height > kMaxImagePixels) {
    throw_value_error("[image] cannot resize a " + std::to_string(picture.size(1)) + " x " +
                      std::to_string(picture.size(0)) + " picture to " + std::to_string(width) + " x " +
                      std::to_string(height) + ": both sides must be at least 1 and the area at most " +
                      std::to_string(kMaxImagePixels) + " pixels");
  }
  auto result = picture.cpu().contiguous();
  // Horizontal first, then vertical, each only when that side changes (PIL's order: it matters,
  // since the first pass is rounded to 8 bits).
  if (width != result.size(1)) result = resample_columns(result, width, filter);
  if (height != result.size(0)) result = resample_rows(result, height, filter);
  return result.data_ptr() == picture.data_ptr() ? result.clone() : result;
}

at::Tensor crop_picture(const at::Tensor& picture, int64_t left, int64_t top, int64_t width, int64_t height) {
  check_resize_input(picture, "crop_picture");
  const int64_t picture_height = picture.size(0), picture_width = picture.size(1);
  const std::string box = "the crop box (left " + std::to_string(left) + ", top " + std::to_string(top) + ", width " +
                          std::to_string(width) + ", height " + std::to_string(height) + ")";
  if (width < 1 || height < 1) throw_value_error("[image] " + box + " is empty: width and height must be at least 1");
  if (left < 0 || top < 0 || left > picture_width - width || top > picture_height - height) {
    throw_value_error("[image] " + box + " is not inside the " + std::to_string(picture_width) + " x " +
                      std::to_string(picture_height) + " picture: it needs 0 <= left, left + width <= " +
                      std::to_string(picture_width) + ", 0 <= top, top + height <= " + std::to_string(picture_height));
  }
  return picture.slice(0, top, top + height).slice(1, left, left + width).contiguous();
}

}  // namespace remat::image
