// resize_picture against a float64 reference of PIL's resampling written here from the formulas
// (per output pixel, weights computed on the spot), and crop_picture's box checks.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../value_error.h"
#include "remat/image/image_file.h"

namespace remat::image {
namespace {
namespace image_resize_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_text;

double cubic(double x) {  // Keys' cubic convolution, a = -0.5
  x = std::abs(x);
  if (x < 1) return 1.5 * x * x * x - 2.5 * x * x + 1;
  if (x < 2) return -0.5 * x * x * x + 2.5 * x * x - 4 * x + 2;
  return 0;
}

double lanczos(double x) {
  if (x == 0) return 1;
  if (std::abs(x) >= 3) return 0;
  const double px = M_PI * x;
  return 3 * std::sin(px) * std::sin(px / 3) / (px * px);
}

// One axis of PIL's resampling in float64: output i is centred at (i + 0.5) * in / out in input
// coordinates; input pixel j (centre j + 0.5) weighs kernel((j + 0.5 - centre) / stretch), where
// stretch = max(in / out, 1); the reach is support * stretch either side, rounded to whole pixels;
// weights normalised to sum 1. The result is rounded and clamped to 8 bits, as PIL stores each pass.
std::vector<double> resample_line(const std::vector<double>& in, int64_t out_size, ResampleFilter filter) {
  const int64_t in_size = static_cast<int64_t>(in.size());
  const double scale = double(in_size) / double(out_size), stretch = std::max(scale, 1.0);
  const double reach = (filter == ResampleFilter::lanczos ? 3.0 : 2.0) * stretch;
  std::vector<double> out(out_size);
  for (int64_t i = 0; i < out_size; ++i) {
    const double centre = (i + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(0, static_cast<int64_t>(std::floor(centre - reach + 0.5)));
    const int64_t hi = std::min<int64_t>(in_size, static_cast<int64_t>(std::floor(centre + reach + 0.5)));
    double sum = 0, total = 0;
    for (int64_t j = lo; j < hi; ++j) {
      const double d = (j + 0.5 - centre) / stretch;
      const double w = filter == ResampleFilter::lanczos ? lanczos(d) : cubic(d);
      sum += w * in[j];
      total += w;
    }
    out[i] = std::min(255.0, std::max(0.0, std::round(sum / total)));
  }
  return out;
}

at::Tensor reference_resize(const at::Tensor& picture, int64_t width, int64_t height, ResampleFilter filter) {
  const int64_t rows = picture.size(0), columns = picture.size(1), channels = picture.size(2);
  auto p = picture.to(torch::kDouble);
  auto a = p.accessor<double, 3>();
  std::vector<std::vector<std::vector<double>>> across(channels, std::vector<std::vector<double>>(rows));
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> line(columns);
      for (int64_t x = 0; x < columns; ++x) line[x] = a[r][x][c];
      across[c][r] = width == columns ? line : resample_line(line, width, filter);
    }
  auto out = torch::zeros({height, width, channels}, torch::kDouble);
  auto o = out.accessor<double, 3>();
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t x = 0; x < width; ++x) {
      std::vector<double> line(rows);
      for (int64_t r = 0; r < rows; ++r) line[r] = across[c][r][x];
      const auto down = height == rows ? line : resample_line(line, height, filter);
      for (int64_t y = 0; y < height; ++y) o[y][x][c] = down[y];
    }
  return out;
}

at::Tensor busy_picture(int64_t height, int64_t width) {
  // Sharp edges (a checkerboard of 3-pixel squares) over a smooth ramp: overshoot and clamping
  // near the edges, smooth interpolation elsewhere.
  auto y = torch::arange(height, torch::kLong).view({height, 1, 1});
  auto x = torch::arange(width, torch::kLong).view({1, width, 1});
  auto c = torch::arange(3, torch::kLong).view({1, 1, 3});
  auto checker = ((y / 3 + x / 3) % 2) * 180;
  return ((checker + x * 2 + y * 3 + c * 20) % 256).to(torch::kByte);
}

int max_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

TEST(ImageResize, MatchesTheFloat64ReferenceWithinOneLevel) {
  const auto picture = busy_picture(45, 61);
  for (ResampleFilter filter : {ResampleFilter::lanczos, ResampleFilter::bicubic}) {
    for (auto [w, h] : std::vector<std::pair<int64_t, int64_t>>{{16, 16}, {20, 13}, {61, 9}, {7, 45}, {90, 70}, {33, 60}}) {
      SCOPED_TRACE(std::to_string(w) + " x " + std::to_string(h) + (filter == ResampleFilter::lanczos ? " lanczos" : " bicubic"));
      const auto resized = resize_picture(picture, w, h, filter);
      ASSERT_EQ(resized.sizes(), (std::vector<int64_t>{h, w, 3}));
      EXPECT_LE(max_difference(resized, reference_resize(picture, w, h, filter)), 1);
    }
  }
}

TEST(ImageResize, ConstantStaysConstant) {
  const auto grey = torch::full({37, 29, 3}, 201, torch::kByte);
  for (ResampleFilter filter : {ResampleFilter::lanczos, ResampleFilter::bicubic}) {
    EXPECT_TRUE(torch::equal(resize_picture(grey, 8, 11, filter), torch::full({11, 8, 3}, 201, torch::kByte)));
    EXPECT_TRUE(torch::equal(resize_picture(grey, 50, 60, filter), torch::full({60, 50, 3}, 201, torch::kByte)));
  }
}

TEST(ImageResize, ShrinkingFiltersOutDetailFinerThanTheNewPixels) {
  // A one-pixel checkerboard shrunk 4x: antialiasing averages it to mid-grey; a filter that
  // only interpolated between neighbours would keep a pattern of 0s and 255s.
  auto y = torch::arange(64).view({64, 1, 1});
  auto x = torch::arange(64).view({1, 64, 1});
  const auto checker = (((y + x) % 2) * 255).expand({64, 64, 3}).to(torch::kByte).contiguous();
  const auto small = resize_picture(checker, 16, 16);
  EXPECT_LE(max_difference(small, torch::full({16, 16, 3}, 127.5, torch::kDouble)), 3);
}

TEST(ImageResize, SameSizeIsACopy) {
  const auto picture = busy_picture(10, 12);
  const auto same = resize_picture(picture, 12, 10);
  EXPECT_TRUE(torch::equal(same, picture));
  EXPECT_NE(same.data_ptr(), picture.data_ptr());
  EXPECT_EQ(error_text([&] { resize_picture(picture, 0, 10); }),
            "[image] cannot resize a 12 x 10 picture to 0 x 10: both sides must be at least 1 and the area at most "
            "67108864 pixels");
}

TEST(ImageCrop, BoxInsideIsCopiedAndBoxOutsideIsRefused) {
  const auto picture = busy_picture(10, 12);
  EXPECT_TRUE(torch::equal(crop_picture(picture, 3, 2, 5, 6), picture.slice(0, 2, 8).slice(1, 3, 8)));
  EXPECT_TRUE(torch::equal(crop_picture(picture, 0, 0, 12, 10), picture));
  EXPECT_EQ(error_text([&] { crop_picture(picture, 8, 0, 5, 10); }),
            "[image] the crop box (left 8, top 0, width 5, height 10) is not inside the 12 x 10 picture: it needs "
            "0 <= left, left + width <= 12, 0 <= top, top + height <= 10");
  EXPECT_NE(error_text([&] { crop_picture(picture, -1, 0, 5, 5); }).find("is not inside the 12 x 10 picture"), std::string::npos);
  EXPECT_NE(error_text([&] { crop_picture(picture, 0, 3, 4, 8); }), "");
  EXPECT_EQ(error_text([&] { crop_picture(picture, 0, 0, 0, 5); }),
            "[image] the crop box (left 0, top 0, width 0, height 5) is empty: width and height must be at least 1");
  EXPECT_EQ(error_text([&] { crop_picture(torch::zeros({4, 4, 3}, torch::kFloat), 0, 0, 1, 1); }),
            "[image] crop_picture needs a non-empty uint8 [height, width, channels] tensor, got Float of size [4, 4, 3]");
}

}  // namespace image_resize_test
}  // namespace
}  // namespace remat::image
