// Pictures in and out: PNG round trips exactly, the VAE conventions match diffusers' formulas, and
// every bad file is refused with its path named before any pixel is decoded.
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../temp_dir.h"
#include "../value_error.h"
#include "remat/image/image_file.h"
#include "remat/image/png_file.h"

namespace remat::image {
namespace {
namespace image_file_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;
using remat::testing::TempDir;

at::Tensor gradient_picture(int64_t height, int64_t width) {
  auto y = torch::arange(height, torch::kLong).view({height, 1, 1});
  auto x = torch::arange(width, torch::kLong).view({1, width, 1});
  auto c = torch::arange(3, torch::kLong).view({1, 1, 3});
  return ((y * 7 + x * 13 + c * 101) % 256).to(torch::kByte);
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(ImageFile, PngRoundTripIsExact) {
  TempDir dir;
  const auto picture = gradient_picture(19, 23);
  write_png((dir / "a.png"), picture);
  const auto back = read_image(dir / "a.png");
  ASSERT_EQ(back.sizes(), picture.sizes());
  EXPECT_TRUE(torch::equal(back, picture));
}

TEST(ImageFile, GreyPngIsExpandedToRgb) {
  TempDir dir;
  const auto grey = gradient_picture(5, 6).select(2, 0).unsqueeze(2).contiguous();
  write_png((dir / "g.png"), grey);
  const auto back = read_image(dir / "g.png");
  ASSERT_EQ(back.sizes(), (std::vector<int64_t>{5, 6, 3}));
  for (int c = 0; c < 3; ++c) EXPECT_TRUE(torch::equal(back.select(2, c), grey.select(2, 0)));
}

TEST(ImageFile, VaeInputFollowsTheFormula) {
  const auto picture = gradient_picture(4, 5);
  const auto input = picture_to_vae_input(picture);
  ASSERT_EQ(input.sizes(), (std::vector<int64_t>{1, 3, 4, 5}));
  for (int64_t y = 0; y < 4; ++y)
    for (int64_t x = 0; x < 5; ++x)
      for (int64_t c = 0; c < 3; ++c) {
        const double expected = picture[y][x][c].item<uint8_t>() / 127.5 - 1.0;
        EXPECT_NEAR(input[0][c][y][x].item<float>(), expected, 1e-6);
      }
  // And back: every 8-bit value survives the round trip exactly.
  EXPECT_TRUE(torch::equal(vae_output_to_picture(input), picture));
}

TEST(ImageFile, VaeOutputIsClampedAndRounded) {
  auto decoded = torch::tensor({-2.0f, -1.0f, 0.0f, 0.003f, 1.0f, 5.0f}).view({1, 3, 1, 2});
  const auto picture = vae_output_to_picture(decoded);
  ASSERT_EQ(picture.sizes(), (std::vector<int64_t>{1, 2, 3}));
  // (x / 2 + 0.5) clamped to [0, 1], times 255, rounded: -2 -> 0, -1 -> 0, 0 -> 128 (127.5 rounds
  // to even 128), 0.003 -> round(127.88) = 128, 1 -> 255, 5 -> 255.
  const std::vector<int> expected = {0, 0, 128, 128, 255, 255};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(picture[0][i % 2][i / 2].item<uint8_t>(), expected[i]) << i;
  }
}

TEST(ImageFile, CenterCropKeepsTheMiddle) {
  const auto picture = gradient_picture(37, 50);
  const auto crop = center_crop_to_multiple(picture, 16);
  ASSERT_EQ(crop.sizes(), (std::vector<int64_t>{32, 48, 3}));
  // 37 -> 32 drops 5 rows: 2 above, 3 below; 50 -> 48 drops 1 column each side.
  EXPECT_TRUE(torch::equal(crop, picture.slice(0, 2, 34).slice(1, 1, 49)));
  EXPECT_EQ(error_of([&] { center_crop_to_multiple(gradient_picture(15, 40), 16); }),
            "[image] a 40 x 15 picture is too small: both sides must be at least 16 pixels\n");
}

TEST(ImageFile, BadFilesAreRefusedByName) {
  TempDir dir;
  write_bytes((dir / "notes.png"), "this is not a picture");
  EXPECT_EQ(error_of([&] { read_image(dir / "notes.png"); }),
            "[image] '" + (dir / "notes.png") +
                "' is not a picture remat can read (Image not of any known type, or corrupt); readable: PNG, "
                "JPEG, WebP, BMP, TGA, GIF, PSD, HDR, PNM, PIC\n");
  EXPECT_NE(error_of([&] { read_image(dir / "missing.png"); }).find("missing.png"), std::string::npos);
  EXPECT_NE(error_of([&] { read_image(dir.str()); }).find("must be a regular file"), std::string::npos);

  // A valid PNG cut after its header: the size is readable, the pixels are not.
  write_png((dir / "whole.png"), gradient_picture(64, 64));
  std::ifstream whole((dir / "whole.png"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(whole)), std::istreambuf_iterator<char>());
  write_bytes((dir / "cut.png"), bytes.substr(0, 40));
  const auto cut = error_of([&] { read_image(dir / "cut.png"); });
  EXPECT_EQ(cut.rfind("[image] cannot decode '" + (dir / "cut.png") + "': ", 0), 0u) << cut;
}

TEST(ImageFile, HugeClaimedSizeIsRefusedBeforeDecoding) {
  // A binary PPM header claiming 100000 x 100000 pixels, with no pixel data at all.
  TempDir dir;
  write_bytes((dir / "huge.ppm"), "P6\n100000 100000\n255\n");
  EXPECT_EQ(error_of([&] { read_image(dir / "huge.ppm"); }),
            "[image] '" + (dir / "huge.ppm") +
                "' is 100000 x 100000 pixels; at most 67108864 pixels (8192 x 8192) are read\n");
}

}  // namespace image_file_test
}  // namespace
}  // namespace remat::image
