#include "remat/image/image_file.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>

#include "image_formats.h"
#include "remat/util/error.h"

// Debian's libstb-dev ships stb as single-file headers; this file is the one translation unit
// that holds their implementation (no link dependency for the installed library).
// JPEG never reaches stb (libjpeg-turbo reads it, image_jpeg.cpp): its JPEG decoder is left out,
// which also keeps stb's Huffman-table builder, which indexes past its table on some damaged
// files (found by fuzz_image), out of the program.
#define STBI_NO_JPEG
#define STB_IMAGE_IMPLEMENTATION
#define STBI_FAILURE_USERMSG
#include <stb/stb_image.h>

namespace remat::image {
namespace {

struct StbFree {
  void operator()(unsigned char* pixels) const { stbi_image_free(pixels); }
};

void check_picture(const at::Tensor& picture, const char* what) {
  if (picture.dim() != 3 || picture.scalar_type() != at::kByte) {
    throw_value_error(std::string("[image] ") + what + " needs a uint8 [height, width, channels] tensor, got " +
                      std::string(c10::toString(picture.scalar_type())) + " with " +
                      std::to_string(picture.dim()) + " dimensions");
  }
}

}  // namespace

namespace detail {

HeaderWalk stb_header(const std::string& path, std::string_view bytes) {
  int width = 0, height = 0, channels = 0;
  if (stbi_info_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()), static_cast<int>(bytes.size()), &width,
                            &height, &channels) == 0) {
    throw_value_error("[image] '" + path + "' is not a picture remat can read (" + stbi_failure_reason() +
                      "); readable: PNG, JPEG, WebP, BMP, TGA, GIF, PSD, HDR, PNM, PIC");
  }
  // stbi_info reports a top-down BMP's height as the file stores it, negative (stb_image.h,
  // stbi__bmp_info); the decoder uses its absolute value (stbi__bmp_load). Taken as it was, a
  // negative height passed the pixel bound, and a 371-byte file decoded 20 x 16777204 pixels
  // (found by fuzz_image), while every real top-down BMP was refused as damaged.
  HeaderWalk walk;
  walk.width = std::abs(static_cast<int64_t>(width));
  walk.height = std::abs(static_cast<int64_t>(height));
  return walk;
}

at::Tensor decode_with_stb(const std::string& path, std::string_view bytes) {
  int width = 0, height = 0, channels = 0;
  std::unique_ptr<unsigned char, StbFree> pixels(stbi_load_from_memory(
      reinterpret_cast<const stbi_uc*>(bytes.data()), static_cast<int>(bytes.size()), &width, &height, &channels, 3));
  if (!pixels) damaged(path, stbi_failure_reason());
  return at::from_blob(pixels.get(), {height, width, 3}, at::kByte).clone();
}

}  // namespace detail

at::Tensor center_crop_to_multiple(const at::Tensor& picture, int64_t multiple) {
  check_picture(picture, "center_crop_to_multiple");
  TORCH_CHECK(multiple > 0, "center_crop_to_multiple: multiple must be positive");
  const int64_t height = picture.size(0), width = picture.size(1);
  if (height < multiple || width < multiple) {
    throw_value_error("[image] a " + std::to_string(width) + " x " + std::to_string(height) +
                      " picture is too small: both sides must be at least " + std::to_string(multiple) + " pixels");
  }
  const int64_t new_height = height / multiple * multiple, new_width = width / multiple * multiple;
  const int64_t top = (height - new_height) / 2, left = (width - new_width) / 2;
  return picture.slice(0, top, top + new_height).slice(1, left, left + new_width).contiguous();
}

at::Tensor picture_to_vae_input(const at::Tensor& picture) {
  check_picture(picture, "picture_to_vae_input");
  return picture.to(at::kFloat).div(127.5).sub(1.0).permute({2, 0, 1}).unsqueeze(0).contiguous();
}

at::Tensor vae_output_to_picture(const at::Tensor& decoded) {
  auto image = decoded.dim() == 4 ? decoded.squeeze(0) : decoded;
  TORCH_CHECK(image.dim() == 3 && image.size(0) == 3, "vae_output_to_picture: expected [1, 3, H, W] or [3, H, W], got ",
              decoded.sizes());
  // diffusers: (x / 2 + 0.5).clamp(0, 1), then * 255 and round.
  return image.to(at::kFloat).div(2).add(0.5).clamp(0, 1).mul(255).round().to(at::kByte).permute({1, 2, 0}).contiguous();
}

}  // namespace remat::image
