#pragma once
/// \file
/// Pictures in and out of the VAE. Read: JPEG with libjpeg-turbo (PIL's decoder), WebP with
/// libwebp, PNG with stb_image after a check of every chunk's CRC, and BMP, TGA, GIF (first
/// frame), PSD, HDR, PNM and PIC with stb_image; the format is told by the file's first bytes, not
/// its name. Written: PNG with stb_image_write. A picture is an 8-bit RGB tensor
/// [height, width, 3] (alpha dropped, grey expanded, a CMYK JPEG converted as PIL converts it:
/// Adobe's inverted CMYK); the VAE sees [1, 3, height, width] floats in
/// [-1, 1].
///
/// Orientation: the EXIF orientation tag (JPEG's APP1 Exif segment, PNG's eXIf chunk, WebP's EXIF
/// chunk; read with libexif) is applied as PIL's ImageOps.exif_transpose does, so read_image
/// returns the picture upright and read_image_info its displayed size.
///
/// Damage: an empty, truncated or corrupt file is refused with c10::ValueError naming the file and
/// the reason, never returned half-decoded: a JPEG whose libjpeg decoding warns of lost pixels
/// (premature end, corrupt entropy data), a PNG with a wrong chunk CRC or no IEND, a WebP shorter
/// than its RIFF header says. An animated WebP is refused (save one frame as a still picture).

#include <cstdint>
#include <string>

#include <ATen/ATen.h>

#include "remat/export.h"

namespace remat::image {

/// The largest picture read_image decodes: 2^26 pixels (8192 x 8192). Its size is read from the
/// header before any pixel is decoded, so a small file claiming a huge picture costs nothing.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;

/// The picture in `path`, upright, as uint8 [height, width, 3]. Throws c10::ValueError naming the
/// path: not a regular file, empty, not a picture remat reads, damaged (with the reason), or larger
/// than kMaxImagePixels (checked from the header, before decoding).
REMAT_API at::Tensor read_image(const std::string& path);

/// What a picture file's header says, read without decoding pixels.
struct ImageInfo {
  int64_t width = 0;       ///< as displayed: EXIF orientation 5-8 swap the stored sides
  int64_t height = 0;
  int orientation = 1;     ///< the EXIF orientation tag (1-8; 1 when absent, damaged or out of range)
  std::string format;      ///< "png", "jpeg", "webp", "bmp", "gif", "psd", "hdr", "pnm", "pic", "tga"
};

/// The header of the picture in `path`, read without decoding pixels (a few hundred bytes of most
/// files: the chunk headers of a PNG, the markers before a JPEG's frame header). Throws
/// c10::ValueError naming the path when it is not a regular file, empty, not a picture remat reads,
/// visibly truncated, an animated WebP, or larger than kMaxImagePixels. Damage inside the
/// compressed pixels is found only by read_image.
REMAT_API ImageInfo read_image_info(const std::string& path);

/// The filters of resize_picture, PIL's formulas.
enum class ResampleFilter {
  bicubic,  ///< PIL's BICUBIC: cubic convolution with a = -0.5
  lanczos,  ///< PIL's LANCZOS: three-lobe Lanczos, the filter SimpleTuner resizes training images with
};

/// uint8 [height, width, C] resized to `width` x `height` as PIL's Image.resize does for 8-bit
/// pictures: the filter widened by the shrink factor when shrinking (antialiased), the horizontal
/// pass first, each pass rounded to 8 bits. Throws c10::ValueError for an empty picture or a
/// target side below 1.
REMAT_API at::Tensor resize_picture(const at::Tensor& picture, int64_t width, int64_t height,
                                    ResampleFilter filter = ResampleFilter::lanczos);

/// The (left, top, width, height) box of uint8 [H, W, C] as a contiguous tensor. Throws
/// c10::ValueError naming the box and the picture's size when the box is empty or not inside it.
REMAT_API at::Tensor crop_picture(const at::Tensor& picture, int64_t left, int64_t top, int64_t width,
                                  int64_t height);

/// The centre crop of uint8 [height, width, C] whose sides are the largest multiples of
/// `multiple` that fit. Throws c10::ValueError if a side is shorter than `multiple`.
REMAT_API at::Tensor center_crop_to_multiple(const at::Tensor& picture, int64_t multiple);

/// uint8 [height, width, 3] -> float32 [1, 3, height, width] in [-1, 1] (x / 127.5 - 1), the VAE's
/// input convention (diffusers' VaeImageProcessor with do_normalize).
REMAT_API at::Tensor picture_to_vae_input(const at::Tensor& picture);

/// The inverse of picture_to_vae_input for one decoded image [1, 3, H, W] or [3, H, W]: clamped to
/// [-1, 1], scaled to [0, 255] and rounded to the nearest integer, as uint8 [H, W, 3].
REMAT_API at::Tensor vae_output_to_picture(const at::Tensor& decoded);

}  // namespace remat::image
