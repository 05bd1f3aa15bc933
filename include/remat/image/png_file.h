#pragma once
/// \file
/// Writing pictures as PNG (libpng): sampled pictures carry their generation parameters in text
/// chunks, the way other tools record them (one tEXt/iTXt chunk per key: "prompt", "seed", ...).

#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "remat/export.h"

namespace remat::image {

using PngText = std::vector<std::pair<std::string, std::string>>;

/// Writes `pixels` (uint8 (H, W, 1), (H, W, 3) or (H, W, 4), CPU) to `path` as an 8-bit grey, RGB or RGBA PNG with
/// `text` as text chunks (keys 1-79 Latin-1 characters as the PNG spec requires; values UTF-8,
/// written as iTXt when not plain ASCII). The file is written to a temporary file in the same
/// directory and renamed, so `path` never holds a partial picture. Throws c10::ValueError naming
/// the path or the bad argument.
REMAT_API void write_png(const std::string& path, const at::Tensor& pixels, const PngText& text = {});

/// Throws the c10::ValueError write_png would throw for `text` (a key that is not a PNG keyword,
/// a value that is not UTF-8 or holds a NUL), naming `path`: a check before any work whose result
/// will be written.
REMAT_API void check_png_text(const PngText& text, const std::string& path);

/// The text chunks of the PNG at `path`, in file order (tEXt, zTXt and iTXt). Throws
/// c10::ValueError naming the path when it is not a readable PNG.
REMAT_API PngText read_png_text(const std::string& path);

}  // namespace remat::image
