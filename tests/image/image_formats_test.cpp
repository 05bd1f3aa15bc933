// The formats read_image reads: lossless WebP round trips exactly (alpha dropped), JPEG comes
// back within its compression error, BMP through stb_image; read_image_info names each format and
// its size without decoding.
#include <array>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../temp_dir.h"
#include "image_test_files.h"
#include "remat/image/image_file.h"
#include "remat/image/png_file.h"

namespace remat::image {
namespace {
namespace image_formats_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::TempDir;
using namespace remat::image::testing;

at::Tensor pattern(int64_t height, int64_t width, int64_t channels) {
  auto y = torch::arange(height, torch::kLong).view({height, 1, 1});
  auto x = torch::arange(width, torch::kLong).view({1, width, 1});
  auto c = torch::arange(channels, torch::kLong).view({1, 1, channels});
  return ((y * 7 + x * 13 + c * 101) % 256).to(torch::kByte);
}

TEST(ImageFormats, LosslessWebpRoundTripIsExact) {
  TempDir dir;
  const auto picture = pattern(19, 23, 3);
  write_bytes(dir / "a.webp", lossless_webp_of(picture));
  EXPECT_TRUE(torch::equal(read_image(dir / "a.webp"), picture));
  const auto info = read_image_info(dir / "a.webp");
  EXPECT_EQ(info.format, "webp");
  EXPECT_EQ(info.width, 23);
  EXPECT_EQ(info.height, 19);
  EXPECT_EQ(info.orientation, 1);
}

TEST(ImageFormats, WebpAlphaIsDropped) {
  TempDir dir;
  // Alpha never 0: a lossless encoder may change the colour of fully transparent pixels.
  auto rgba = pattern(9, 11, 4);
  rgba.select(2, 3).clamp_(1, 255);
  write_bytes(dir / "alpha.webp", lossless_webp_of(rgba));
  EXPECT_TRUE(torch::equal(read_image(dir / "alpha.webp"), rgba.slice(2, 0, 3)));
}

TEST(ImageFormats, JpegIsReadWithinItsCompressionError) {
  TempDir dir;
  const auto picture = smooth_picture(32, 48);
  write_bytes(dir / "a.jpeg", jpeg_of(picture, 95));
  const auto back = read_image(dir / "a.jpeg");
  ASSERT_EQ(back.sizes(), picture.sizes());
  EXPECT_LE((back.to(torch::kInt) - picture.to(torch::kInt)).abs().max().item<int>(), 8);
  const auto info = read_image_info(dir / "a.jpeg");
  EXPECT_EQ(info.format, "jpeg");
  EXPECT_EQ(info.width, 48);
  EXPECT_EQ(info.height, 32);
}

TEST(ImageFormats, CmykJpegIsConvertedAsPilDoes) {
  TempDir dir;
  // 16 x 16 blocks of flat colour survive JPEG at quality 100 to within a level or two.
  const std::vector<std::array<int, 4>> colours = {
      {255, 128, 0, 255}, {200, 100, 50, 128}, {0, 0, 0, 255}, {255, 255, 255, 0}, {90, 180, 30, 200}, {10, 250, 120, 60}};
  auto cmyk = torch::empty({16, 16 * static_cast<int64_t>(colours.size()), 4}, torch::kByte);
  for (size_t i = 0; i < colours.size(); ++i)
    for (int k = 0; k < 4; ++k) cmyk.slice(1, 16 * i, 16 * (i + 1)).select(2, k).fill_(colours[i][k]);
  write_bytes(dir / "print.jpg", cmyk_jpeg_of(cmyk));
  const auto rgb = read_image(dir / "print.jpg");
  ASSERT_EQ(rgb.sizes(), (std::vector<int64_t>{16, 16 * static_cast<int64_t>(colours.size()), 3}));
  // PIL's reading: stored values are Adobe's inverted CMYK, so ink C = 255 - v_C and the
  // not-black fraction is v_K / 255; red = 255 * (1 - C / 255) * (1 - K / 255) = v_C * v_K / 255.
  for (size_t i = 0; i < colours.size(); ++i)
    for (int c = 0; c < 3; ++c) {
      const double expected = colours[i][c] * colours[i][3] / 255.0;
      const auto block = rgb.slice(1, 16 * i, 16 * (i + 1)).select(2, c).to(torch::kDouble);
      EXPECT_LE((block - expected).abs().max().item<double>(), 2.5) << "colour " << i << " channel " << c;
    }
}

TEST(ImageFormats, FormatIsToldByContentNotName) {
  TempDir dir;
  const auto picture = pattern(5, 7, 3);
  write_bytes(dir / "really_webp.png", lossless_webp_of(picture));
  write_bytes(dir / "really_bmp.jpg", bmp_of(picture));
  write_png(dir / "really_png.webp", picture);
  EXPECT_TRUE(torch::equal(read_image(dir / "really_webp.png"), picture));
  EXPECT_TRUE(torch::equal(read_image(dir / "really_bmp.jpg"), picture));
  EXPECT_TRUE(torch::equal(read_image(dir / "really_png.webp"), picture));
  EXPECT_EQ(read_image_info(dir / "really_webp.png").format, "webp");
  EXPECT_EQ(read_image_info(dir / "really_bmp.jpg").format, "bmp");
  const auto png = read_image_info(dir / "really_png.webp");
  EXPECT_EQ(png.format, "png");
  EXPECT_EQ(png.width, 7);
  EXPECT_EQ(png.height, 5);
}

}  // namespace image_formats_test
}  // namespace
}  // namespace remat::image
