#pragma once
// Picture files made in the tests with encoders independent of remat's readers: JPEG and BMP by
// stb_image_write, lossless WebP by libwebp, EXIF blocks by libexif, and the containers around
// them (a JPEG APP1 segment, a PNG eXIf chunk, WebP's extended and animated layouts) by hand from
// their specifications.

#include <cstdint>
#include <string>

#include <ATen/ATen.h>

namespace remat::image::testing {

std::string read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::string& bytes);

/// uint8 [h, w, 3] with a distinct colour at each position, smooth enough for JPEG to keep it
/// within a few levels.
at::Tensor smooth_picture(int64_t height, int64_t width);

/// Baseline JPEG (stb_image_write) of uint8 [h, w, 3] at `quality`.
std::string jpeg_of(const at::Tensor& picture, int quality = 95);
/// Four-component (CMYK) JPEG of uint8 [h, w, 4] by libjpeg, the stored values as given (with
/// libjpeg's Adobe marker, as Photoshop writes them).
std::string cmyk_jpeg_of(const at::Tensor& cmyk, int quality = 100);
/// BMP (stb_image_write) of uint8 [h, w, 3].
std::string bmp_of(const at::Tensor& picture);
/// Lossless WebP (libwebp's WebPEncodeLosslessRGB / RGBA) of uint8 [h, w, 3 or 4].
std::string lossless_webp_of(const at::Tensor& picture);

/// An EXIF block ("Exif\0\0" and TIFF data) whose IFD0 holds `orientation` (libexif).
std::string exif_block(int orientation, bool big_endian);
/// `jpeg` with an APP1 segment holding `exif` right after SOI.
std::string jpeg_with_exif(const std::string& jpeg, const std::string& exif);
/// `png` with an eXIf chunk (the TIFF data of `exif`, without "Exif\0\0") after IHDR.
std::string png_with_exif(const std::string& png, const std::string& exif);
/// A simple-format lossless WebP rewritten as an extended one (VP8X) with an EXIF chunk.
std::string webp_with_exif(const std::string& webp, int64_t width, int64_t height, const std::string& exif);
/// A two-frame animated WebP whose frames are the bitstream of the simple lossless `webp`.
std::string animated_webp(const std::string& webp, int64_t width, int64_t height);

}  // namespace remat::image::testing
