#pragma once
/// \file
/// Pictures in and out of the VAE: PNG, JPEG, BMP, TGA, GIF (first frame), PSD, HDR, PNM and PIC
/// files are read with Debian's stb_image, PNG files written with stb_image_write. A picture is an
/// 8-bit RGB tensor [height, width, 3]; the VAE sees [1, 3, height, width] floats in [-1, 1].

#include <cstdint>
#include <string>

#include <ATen/ATen.h>

#include "remat/export.h"

namespace remat::encoders {

/// The largest picture read_image decodes: 2^26 pixels (8192 x 8192). Its size is read from the
/// header before any pixel is decoded, so a small file claiming a huge picture costs nothing.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;

/// The picture in `path` as uint8 [height, width, 3] (grey and alpha dropped or expanded to RGB).
/// Throws c10::ValueError naming the path: not a regular file, not a picture stb_image can read
/// (with its reason), or larger than kMaxImagePixels.
REMAT_API at::Tensor read_image(const std::string& path);

/// What a picture file's header says, read without decoding pixels.
struct ImageInfo {
  int64_t width = 0;       ///< as displayed: EXIF orientation 5-8 swap the stored sides
  int64_t height = 0;
  int orientation = 1;     ///< the EXIF orientation tag (1-8; 1 when absent or not a JPEG)
  std::string format;      ///< "png", "jpeg", "webp", ...
};

/// The header of the picture in `path`. Throws c10::ValueError naming the path when it is not a
/// regular file, not a picture remat reads, or larger than kMaxImagePixels.
REMAT_API ImageInfo read_image_info(const std::string& path);

/// uint8 [height, width, 3] resized to `height` x `width` with antialiased bicubic filtering
/// (PIL's BICUBIC resampling, which filters over the whole footprint when shrinking).
REMAT_API at::Tensor resize_picture(const at::Tensor& picture, int64_t width, int64_t height);

/// The (left, top, width, height) box of uint8 [H, W, C] as a contiguous tensor. Throws
/// c10::ValueError when the box is not inside the picture.
REMAT_API at::Tensor crop_picture(const at::Tensor& picture, int64_t left, int64_t top, int64_t width,
                                  int64_t height);

/// Writes uint8 [height, width, 3] (or [height, width, 1]) as a PNG file, atomically (temporary
/// file, then rename): `path` is either the old file or the whole new one.
REMAT_API void write_png(const std::string& path, const at::Tensor& rgb);

/// The centre crop of uint8 [height, width, C] whose sides are the largest multiples of
/// `multiple` that fit. Throws c10::ValueError if a side is shorter than `multiple`.
REMAT_API at::Tensor center_crop_to_multiple(const at::Tensor& picture, int64_t multiple);

/// uint8 [height, width, 3] -> float32 [1, 3, height, width] in [-1, 1] (x / 127.5 - 1), the VAE's
/// input convention (diffusers' VaeImageProcessor with do_normalize).
REMAT_API at::Tensor picture_to_vae_input(const at::Tensor& picture);

/// The inverse of picture_to_vae_input for one decoded image [1, 3, H, W] or [3, H, W]: clamped to
/// [-1, 1], scaled to [0, 255] and rounded to the nearest integer, as uint8 [H, W, 3].
REMAT_API at::Tensor vae_output_to_picture(const at::Tensor& decoded);

}  // namespace remat::encoders
