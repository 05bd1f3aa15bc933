// Bad picture files: every empty, cut or corrupted file is refused with a c10::ValueError naming
// it and saying why, from read_image and (where the header shows it) read_image_info; none crashes
// and none comes back half-decoded.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <vector>

#include "../temp_dir.h"
#include "../value_error.h"
#include "image_test_files.h"
#include "remat/image/image_file.h"
#include "remat/image/png_file.h"

namespace remat::image {
namespace {
namespace image_damage_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_text;
using remat::testing::TempDir;
using namespace remat::image::testing;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The three formats' files of one picture, keyed by extension.
std::vector<std::pair<std::string, std::string>> files_of(const TempDir& dir, const at::Tensor& picture) {
  write_png(dir / "source.png", picture);
  return {{"png", read_bytes(dir / "source.png")},
          {"jpg", jpeg_of(picture, 90)},
          {"webp", lossless_webp_of(picture)}};
}

TEST(ImageDamage, EmptyFilesAreRefusedByName) {
  TempDir dir;
  for (const char* extension : {"png", "jpg", "webp"}) {
    const std::string path = dir / (std::string("empty.") + extension);
    write_bytes(path, "");
    EXPECT_EQ(error_text([&] { read_image(path); }), "[image] '" + path + "' is empty (0 bytes)");
    EXPECT_EQ(error_text([&] { read_image_info(path); }), "[image] '" + path + "' is empty (0 bytes)");
  }
}

TEST(ImageDamage, EveryCutOfEveryFormatIsRefused) {
  TempDir dir;
  for (const auto& [extension, bytes] : files_of(dir, smooth_picture(24, 40))) {
    // Every prefix length from a few bytes to one byte short of the whole file: the last bytes
    // of a JPEG are its EOI marker, whose absence libjpeg reports as a premature end.
    const std::string path = dir / ("cut." + extension);
    for (size_t length = 1; length < bytes.size(); length += (length < 64 ? 1 : 13)) {
      SCOPED_TRACE(extension + " cut to " + std::to_string(length) + " of " + std::to_string(bytes.size()) + " bytes");
      write_bytes(path, bytes.substr(0, length));
      const std::string message = error_text([&] { read_image(path); });
      EXPECT_TRUE(contains(message, "'" + path + "'")) << message;
    }
    write_bytes(path, bytes.substr(0, bytes.size() - 1));
    EXPECT_NE(error_text([&] { read_image(path); }), "") << extension;
  }
}

TEST(ImageDamage, CutsAreNamedAsSuch) {
  TempDir dir;
  const auto files = files_of(dir, smooth_picture(24, 40));
  const auto cut = [&](size_t index, double fraction) {
    const std::string path = dir / ("half." + files[index].first);
    write_bytes(path, files[index].second.substr(0, static_cast<size_t>(files[index].second.size() * fraction)));
    return path;
  };
  std::string path = cut(0, 0.6);
  EXPECT_EQ(error_text([&] { read_image(path); }),
            "[image] cannot decode '" + path + "': the PNG file ends inside its 'IDAT' chunk (truncated)");
  path = cut(1, 0.8);  // inside the entropy-coded data: stb_image would return grey rows here
  EXPECT_EQ(error_text([&] { read_image(path); }),
            "[image] cannot decode '" + path + "': JPEG: Premature end of JPEG file");
  path = cut(2, 0.6);
  const std::string webp = error_text([&] { read_image(path); });
  EXPECT_EQ(webp.rfind("[image] cannot decode '" + path + "': the WebP file is truncated (", 0), 0u) << webp;
  // read_image_info sees the missing end of PNG and WebP files without decoding.
  EXPECT_EQ(error_text([&] { read_image_info(path); }), webp);
}

TEST(ImageDamage, CorruptBytesAreFound) {
  TempDir dir;
  const auto files = files_of(dir, smooth_picture(24, 40));
  // PNG: one flipped bit inside the image data; only the chunk's CRC tells.
  std::string png = files[0].second;
  const size_t idat = png.find("IDAT");
  png[idat + 4 + 10] ^= 0x01;
  write_bytes(dir / "flipped.png", png);
  EXPECT_EQ(error_text([&] { read_image(dir / "flipped.png"); }),
            "[image] cannot decode '" + (dir / "flipped.png") + "': corrupt PNG: the CRC of chunk 'IDAT' at byte " +
                std::to_string(idat - 4) + " is wrong");
  // JPEG: a restart marker in the middle of the entropy-coded data (which has no checksum).
  std::string jpeg = files[1].second;
  const size_t scan = jpeg.find("\xff\xda");
  ASSERT_NE(scan, std::string::npos);
  const size_t middle = scan + (jpeg.size() - scan) / 2;
  jpeg[middle] = '\xff';
  jpeg[middle + 1] = '\xd3';
  write_bytes(dir / "marker.jpg", jpeg);
  const std::string jpeg_error = error_text([&] { read_image(dir / "marker.jpg"); });
  EXPECT_EQ(jpeg_error.rfind("[image] cannot decode '" + (dir / "marker.jpg") + "': JPEG: Corrupt JPEG data", 0), 0u)
      << jpeg_error;
  // JPEG: garbage where the second marker should be (after SOI and the first segment).
  jpeg = files[1].second;
  const size_t second = 4 + ((static_cast<uint8_t>(jpeg[4]) << 8) | static_cast<uint8_t>(jpeg[5]));
  jpeg[second] = 'x';
  write_bytes(dir / "garbage.jpg", jpeg);
  const std::string garbage = "[image] cannot decode '" + (dir / "garbage.jpg") + "': corrupt JPEG: no marker at byte " +
                              std::to_string(second);
  EXPECT_EQ(error_text([&] { read_image_info(dir / "garbage.jpg"); }), garbage);
  EXPECT_EQ(error_text([&] { read_image(dir / "garbage.jpg"); }), garbage);
  // WebP: the lossless bitstream's signature byte (0x2f) changed.
  std::string webp = files[2].second;
  ASSERT_EQ(webp.substr(12, 4), "VP8L");
  webp[20] = '\x30';
  write_bytes(dir / "bad.webp", webp);
  EXPECT_EQ(error_text([&] { read_image(dir / "bad.webp"); }),
            "[image] cannot decode '" + (dir / "bad.webp") + "': corrupt WebP data");
  // Not a picture at all.
  write_bytes(dir / "notes.jpg", "this is not a picture");
  EXPECT_EQ(error_text([&] { read_image(dir / "notes.jpg"); }),
            "[image] '" + (dir / "notes.jpg") +
                "' is not a picture remat can read (Image not of any known type, or corrupt); readable: PNG, JPEG, "
                "WebP, BMP, TGA, GIF, PSD, HDR, PNM, PIC");
}

TEST(ImageDamage, AnimatedWebpIsRefused) {
  TempDir dir;
  const auto picture = smooth_picture(6, 8);
  write_bytes(dir / "moving.webp", animated_webp(lossless_webp_of(picture), 8, 6));
  const std::string expected = "[image] cannot decode '" + (dir / "moving.webp") +
                               "': an animated WebP is not read (save one frame as a still picture)";
  EXPECT_EQ(error_text([&] { read_image(dir / "moving.webp"); }), expected);
  EXPECT_EQ(error_text([&] { read_image_info(dir / "moving.webp"); }), expected);
}

TEST(ImageDamage, HugeJpegIsRefusedFromItsHeader) {
  TempDir dir;
  // A real JPEG header whose frame says 60000 x 60000 pixels (SOF0: FFC0, length, precision,
  // height, width): refused before libjpeg allocates anything.
  std::string jpeg = jpeg_of(smooth_picture(8, 8));
  const size_t frame = jpeg.find("\xff\xc0");
  ASSERT_NE(frame, std::string::npos);
  for (size_t at : {frame + 5, frame + 7}) {
    jpeg[at] = static_cast<char>(60000 >> 8);
    jpeg[at + 1] = static_cast<char>(60000 & 0xFF);
  }
  write_bytes(dir / "huge.jpg", jpeg);
  const std::string expected =
      "[image] '" + (dir / "huge.jpg") + "' is 60000 x 60000 pixels; at most 67108864 pixels (8192 x 8192) are read";
  EXPECT_EQ(error_text([&] { read_image(dir / "huge.jpg"); }), expected);
  EXPECT_EQ(error_text([&] { read_image_info(dir / "huge.jpg"); }), expected);
}

// A 24-bit BMP of `width` x `height` pixels (BITMAPINFOHEADER), rows as given, written top-down
// when `top_down` (the header's height negative, as the BMP format stores such files).
std::string bmp_of(int32_t width, int32_t height, bool top_down, const std::vector<std::array<uint8_t, 3>>& rgb_rows) {
  const auto le32 = [](std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
  };
  const auto le16 = [](std::string& out, uint16_t v) {
    out += static_cast<char>(v & 0xFF);
    out += static_cast<char>(v >> 8);
  };
  const uint32_t row_bytes = (static_cast<uint32_t>(width) * 3 + 3) / 4 * 4;
  std::string pixels;
  for (const auto& rgb : rgb_rows) {
    std::string row;
    for (int32_t x = 0; x < width; ++x) row += {static_cast<char>(rgb[2]), static_cast<char>(rgb[1]), static_cast<char>(rgb[0])};
    row.resize(row_bytes, '\0');
    pixels += row;
  }
  std::string out = "BM";
  le32(out, 54 + static_cast<uint32_t>(pixels.size()));
  le32(out, 0);
  le32(out, 54);
  le32(out, 40);
  le32(out, static_cast<uint32_t>(width));
  le32(out, static_cast<uint32_t>(top_down ? -height : height));
  le16(out, 1);
  le16(out, 24);
  for (int i = 0; i < 6; ++i) le32(out, 0);  // no compression, sizes and palette unset
  return out + pixels;
}

// A top-down BMP (negative height in its header, which stb's info call passes on as it is) reads
// upright with its real size; one whose height is beyond the pixel bound is refused from its
// header (it used to pass the bound as a negative number and decode for seconds: fuzz_image).
TEST(ImageDamage, TopDownBmpHeightsAreTheirSize) {
  TempDir dir;
  write_bytes(dir / "top_down.bmp", bmp_of(2, 3, true, {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}}));
  const at::Tensor picture = read_image(dir / "top_down.bmp");
  ASSERT_EQ(picture.sizes(), (std::vector<int64_t>{3, 2, 3}));
  EXPECT_EQ(picture[0][1][0].item<int>(), 255);  // the first row stored is the top row
  EXPECT_EQ(picture[2][0][2].item<int>(), 255);
  const ImageInfo info = read_image_info(dir / "top_down.bmp");
  EXPECT_EQ(info.width, 2);
  EXPECT_EQ(info.height, 3);
  write_bytes(dir / "tall.bmp", bmp_of(20, 16777204, true, {{1, 2, 3}}));
  const std::string expected = "[image] '" + (dir / "tall.bmp") +
                               "' is 20 x 16777204 pixels; at most 67108864 pixels (8192 x 8192) are read";
  EXPECT_EQ(error_text([&] { read_image(dir / "tall.bmp"); }), expected);
  EXPECT_EQ(error_text([&] { read_image_info(dir / "tall.bmp"); }), expected);
}

}  // namespace image_damage_test
}  // namespace
}  // namespace remat::image
