// EXIF orientation: for each of the eight orientations a picture is stored as a camera would store
// it, and read_image must give it upright; read_image_info must give the displayed size. The
// expected picture is computed here from the EXIF specification's wording (where the stored
// first row and first column are shown), independently of remat's transforms.
#include <functional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../temp_dir.h"
#include "image_test_files.h"
#include "remat/image/image_file.h"
#include "remat/image/png_file.h"

namespace remat::image {
namespace {
namespace image_exif_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::TempDir;
using namespace remat::image::testing;

// The displayed picture of `stored` [rows, columns, 3] under `orientation`, from the EXIF 2.32
// table: 1 row 0 top, column 0 left; 2 row 0 top, column 0 right; 3 row 0 bottom, column 0 right;
// 4 row 0 bottom, column 0 left; 5 row 0 left, column 0 top; 6 row 0 right, column 0 top;
// 7 row 0 right, column 0 bottom; 8 row 0 left, column 0 bottom. Stored (r, c) goes to displayed
// (x, y); the loop runs over stored positions and places each one.
at::Tensor displayed(const at::Tensor& stored, int orientation) {
  const int64_t rows = stored.size(0), columns = stored.size(1);
  const bool quarter_turn = orientation >= 5;
  const int64_t shown_width = quarter_turn ? rows : columns, shown_height = quarter_turn ? columns : rows;
  auto out = torch::zeros({shown_height, shown_width, 3}, torch::kByte);
  auto in_a = stored.accessor<uint8_t, 3>();
  auto out_a = out.accessor<uint8_t, 3>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < columns; ++c) {
      int64_t x = 0, y = 0;
      switch (orientation) {
        case 1: x = c; y = r; break;
        case 2: x = shown_width - 1 - c; y = r; break;
        case 3: x = shown_width - 1 - c; y = shown_height - 1 - r; break;
        case 4: x = c; y = shown_height - 1 - r; break;
        case 5: x = r; y = c; break;                                        // row 0 left, column 0 top
        case 6: x = shown_width - 1 - r; y = c; break;                      // row 0 right, column 0 top
        case 7: x = shown_width - 1 - r; y = shown_height - 1 - c; break;   // row 0 right, column 0 bottom
        case 8: x = r; y = shown_height - 1 - c; break;                     // row 0 left, column 0 bottom
      }
      for (int k = 0; k < 3; ++k) out_a[y][x][k] = in_a[r][c][k];
    }
  }
  return out;
}

TEST(ImageExif, EveryJpegOrientationIsReadUpright) {
  TempDir dir;
  // 20 x 12 stored pixels: not square, so a wrong quarter turn changes the size, and no symmetry
  // of smooth_picture survives a flip.
  const auto stored = smooth_picture(12, 20);
  const std::string jpeg = jpeg_of(stored, 95);
  write_bytes(dir / "plain.jpg", jpeg);
  const auto plain = read_image(dir / "plain.jpg");
  // The plain decode is the stored picture, to JPEG's precision.
  ASSERT_EQ(plain.sizes(), stored.sizes());
  EXPECT_LE((plain.to(torch::kInt) - stored.to(torch::kInt)).abs().max().item<int>(), 8);
  for (int orientation = 1; orientation <= 8; ++orientation) {
    for (bool big_endian : {false, true}) {
      SCOPED_TRACE("orientation " + std::to_string(orientation) + (big_endian ? " (Motorola)" : " (Intel)"));
      const std::string name = dir / ("o" + std::to_string(orientation) + (big_endian ? "m" : "i") + ".jpg");
      write_bytes(name, jpeg_with_exif(jpeg, exif_block(orientation, big_endian)));
      // Same entropy-coded data as plain.jpg, so the only difference is the transform: exact.
      const auto upright = read_image(name);
      EXPECT_TRUE(torch::equal(upright, displayed(plain, orientation)));
      const auto info = read_image_info(name);
      EXPECT_EQ(info.orientation, orientation);
      EXPECT_EQ(info.format, "jpeg");
      EXPECT_EQ(info.width, orientation >= 5 ? 12 : 20);
      EXPECT_EQ(info.height, orientation >= 5 ? 20 : 12);
      EXPECT_EQ(info.width, upright.size(1));
      EXPECT_EQ(info.height, upright.size(0));
    }
  }
}

TEST(ImageExif, PngAndWebpExifChunksAreHonoured) {
  TempDir dir;
  const auto stored = smooth_picture(6, 10);
  // Lossless formats: the upright picture is exactly the transformed original.
  write_png(dir / "plain.png", stored);
  write_bytes(dir / "turned.png", png_with_exif(read_bytes(dir / "plain.png"), exif_block(6, true)));
  EXPECT_TRUE(torch::equal(read_image(dir / "turned.png"), displayed(stored, 6)));
  const auto png_info = read_image_info(dir / "turned.png");
  EXPECT_EQ(png_info.orientation, 6);
  EXPECT_EQ(png_info.width, 6);
  EXPECT_EQ(png_info.height, 10);

  write_bytes(dir / "turned.webp", webp_with_exif(lossless_webp_of(stored), 10, 6, exif_block(8, false)));
  EXPECT_TRUE(torch::equal(read_image(dir / "turned.webp"), displayed(stored, 8)));
  const auto webp_info = read_image_info(dir / "turned.webp");
  EXPECT_EQ(webp_info.orientation, 8);
  EXPECT_EQ(webp_info.format, "webp");
  EXPECT_EQ(webp_info.width, 6);
  EXPECT_EQ(webp_info.height, 10);
}

TEST(ImageExif, MeaninglessOrientationsLeaveThePictureAsStored) {
  TempDir dir;
  const auto stored = smooth_picture(6, 10);
  write_png(dir / "plain.png", stored);
  const std::string png = read_bytes(dir / "plain.png");
  // 0 and 9 are not orientations; a block cut short is not EXIF libexif can read.
  const std::string cut = exif_block(6, false).substr(0, 12);
  for (const std::string& exif : {exif_block(0, false), exif_block(9, true), cut}) {
    write_bytes(dir / "odd.png", png_with_exif(png, exif));
    EXPECT_TRUE(torch::equal(read_image(dir / "odd.png"), stored));
    EXPECT_EQ(read_image_info(dir / "odd.png").orientation, 1);
  }
}

}  // namespace image_exif_test
}  // namespace
}  // namespace remat::image
