// PNG output: pixels read back by remat's picture decoder (stb_image, not libpng), text chunks
// read back by read_png_text and checked by a chunk walk written here (which chunk type holds
// which key), and nothing written when writing fails.

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/image/image_file.h"
#include "remat/image/png_file.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::image {
namespace {
namespace png_file_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;
using remat::testing::TempDir;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// (chunk type, keyword) of every text chunk, walking the PNG chunk list by hand.
std::vector<std::pair<std::string, std::string>> text_chunk_types(const std::string& bytes) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t at = 8;
  while (at + 12 <= bytes.size()) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + at);
    const size_t length = (size_t{p[0]} << 24) | (size_t{p[1]} << 16) | (size_t{p[2]} << 8) | p[3];
    const std::string type = bytes.substr(at + 4, 4);
    if (type == "tEXt" || type == "zTXt" || type == "iTXt") {
      const std::string data = bytes.substr(at + 8, length);
      out.emplace_back(type, data.substr(0, data.find('\0')));
    }
    at += 12 + length;
  }
  return out;
}

at::Tensor random_pixels(int64_t h, int64_t w, int64_t channels) {
  torch::manual_seed(h * 100 + w);
  return torch::randint(0, 256, {h, w, channels}, at::kByte);
}

TEST(PngFileTest, PixelsRoundTrip) {
  TempDir dir;
  const at::Tensor rgb = random_pixels(7, 5, 3);
  write_png(dir / "rgb.png", rgb);
  EXPECT_TRUE(at::equal(image::read_image(dir / "rgb.png"), rgb));
  // RGBA: remat's reader drops alpha, the colour channels come back unchanged.
  const at::Tensor rgba = random_pixels(4, 9, 4);
  write_png(dir / "rgba.png", rgba);
  EXPECT_TRUE(at::equal(image::read_image(dir / "rgba.png"), rgba.slice(2, 0, 3)));
  // A non-contiguous view is written as it looks.
  const at::Tensor view = random_pixels(6, 8, 3).transpose(0, 1);
  write_png(dir / "view.png", view);
  EXPECT_TRUE(at::equal(image::read_image(dir / "view.png"), view));
}

TEST(PngFileTest, TextChunksRoundTripInOrderWithNonAscii) {
  TempDir dir;
  const PngText text = {
      {"prompt", "a red cube — un cube rouge, 赤い立方体 🟥"},
      {"negative_prompt", ""},
      {"seed", "42"},
      {"steps", "28"},
      {"model", "/models/FLUX.1-dev"},
      {"multi line", "first\nsecond"},
      {"Schlüssel", "Latin-1 key, ASCII value"},
      {"software", "remat"},
  };
  write_png(dir / "t.png", random_pixels(3, 3, 3), text);
  EXPECT_EQ(read_png_text(dir / "t.png"), text);
  // ASCII values as tEXt (every tool reads it), the others as iTXt (UTF-8); keys in Latin-1.
  const auto chunks = text_chunk_types(file_bytes(dir / "t.png"));
  ASSERT_EQ(chunks.size(), text.size());
  EXPECT_EQ(chunks[0], (std::pair<std::string, std::string>{"iTXt", "prompt"}));
  EXPECT_EQ(chunks[2], (std::pair<std::string, std::string>{"tEXt", "seed"}));
  EXPECT_EQ(chunks[6], (std::pair<std::string, std::string>{"tEXt", "Schl\xFC" "ssel"}));
}

TEST(PngFileTest, BadArgumentsWriteNothing) {
  TempDir dir;
  const std::string path = dir / "out.png";
  const at::Tensor pixels = random_pixels(4, 4, 3);
  auto expect_refused = [&](const at::Tensor& p, const PngText& text, const std::string& needle) {
    const std::string message = error_of([&] { write_png(path, p, text); });
    EXPECT_NE(message.find(needle), std::string::npos) << message;
    EXPECT_FALSE(std::filesystem::exists(path));
  };
  expect_refused(pixels.to(at::kFloat), {}, "uint8");
  expect_refused(random_pixels(4, 4, 2), {}, "(H, W, 3)");
  expect_refused(pixels, {{"", "v"}}, "PNG keyword");
  expect_refused(pixels, {{std::string(80, 'k'), "v"}}, "PNG keyword");
  expect_refused(pixels, {{" lead", "v"}}, "PNG keyword");
  expect_refused(pixels, {{"two  spaces", "v"}}, "PNG keyword");
  expect_refused(pixels, {{"cat 猫", "v"}}, "PNG keyword");
  expect_refused(pixels, {{"k", std::string("a\0b", 3)}}, "NUL");
  expect_refused(pixels, {{"k", "\xC3("}}, "UTF-8");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  // The same checks without writing.
  EXPECT_NE(error_of([&] { check_png_text({{"k", "\xC3("}}, path); }).find("UTF-8"), std::string::npos);
  EXPECT_NE(error_of([&] { check_png_text({{"", "v"}}, path); }).find("PNG keyword"), std::string::npos);
  check_png_text({{"prompt", "猫"}}, path);
}

TEST(PngFileTest, AFailedWriteKeepsTheOldFile) {
  TempDir dir;
  const std::string path = dir / "keep.png";
  const at::Tensor first = random_pixels(5, 5, 3);
  write_png(path, first, {{"seed", "1"}});
  error_of([&] { write_png(path, random_pixels(2, 2, 3), {{"", "x"}}); });
  EXPECT_TRUE(at::equal(image::read_image(path), first));
  EXPECT_EQ(read_png_text(path), (PngText{{"seed", "1"}}));
  // A directory that does not exist: an error naming the path, nothing created.
  const std::string missing = dir / "no/such/dir/x.png";
  EXPECT_NE(error_of([&] { write_png(missing, first); }).find("x.png"), std::string::npos);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(PngFileTest, ReadingTextOfANonPngOrDamagedFileNamesIt) {
  TempDir dir;
  std::ofstream(dir / "not.png") << "hello, not a picture";
  EXPECT_NE(error_of([&] { read_png_text(dir / "not.png"); }).find("not.png"), std::string::npos);
  write_png(dir / "whole.png", random_pixels(16, 16, 3), {{"prompt", "x"}});
  const std::string bytes = file_bytes(dir / "whole.png");
  std::ofstream(dir / "cut.png", std::ios::binary) << bytes.substr(0, bytes.size() - 30);
  EXPECT_NE(error_of([&] { read_png_text(dir / "cut.png"); }).find("cut.png"), std::string::npos);
  EXPECT_NE(error_of([&] { read_png_text(dir / "missing.png"); }).find("missing.png"), std::string::npos);
}

}  // namespace png_file_test
}  // namespace
}  // namespace remat::image
