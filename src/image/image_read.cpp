// read_image and read_image_info: the format by the file's first bytes, the size from its header
// (checked against kMaxImagePixels before any pixel is decoded), the decoder, then the EXIF
// orientation, so every reader of pictures sees them upright.
#include <string>

#include "image_formats.h"
#include "remat/image/image_file.h"
#include "remat/util/error.h"
#include "remat/util/files.h"

namespace remat::image {
namespace {

using detail::PictureFormat;

const char* format_name(PictureFormat format) {
  switch (format) {
    case PictureFormat::png: return "png";
    case PictureFormat::jpeg: return "jpeg";
    case PictureFormat::webp: return "webp";
    default: return "other";
  }
}

void check_size(const std::string& path, int64_t width, int64_t height) {
  if (width * height > kMaxImagePixels) {
    throw_value_error("[image] '" + path + "' is " + std::to_string(width) + " x " + std::to_string(height) +
                      " pixels; at most " + std::to_string(kMaxImagePixels) + " pixels (8192 x 8192) are read");
  }
}

void check_not_empty(const std::string& path, uint64_t size) {
  if (size == 0) throw_value_error("[image] '" + path + "' is empty (0 bytes)");
}

constexpr uint64_t kStbHeaderBytes = 64 * 1024;

// The header walk of `format`: its size, its EXIF block and (WebP) whether it is animated.
detail::HeaderWalk walk(const std::string& path, PictureFormat format, detail::ByteSource& bytes, bool whole_file) {
  switch (format) {
    case PictureFormat::png: return detail::walk_png(path, bytes, /*check_crcs=*/whole_file);
    case PictureFormat::jpeg: return detail::walk_jpeg(path, bytes);
    case PictureFormat::webp: return detail::walk_webp(path, bytes);
    // stb's header readers need the first bytes only (the whole file when decoding anyway).
    default: return detail::stb_header(path, bytes.read(0, whole_file ? bytes.size() : kStbHeaderBytes));
  }
}

}  // namespace

at::Tensor read_image(const std::string& path) {
  util::require_regular_file(path, "image", "a picture");
  const std::string bytes = detail::read_file_bytes(path);
  check_not_empty(path, bytes.size());
  const PictureFormat format = detail::sniff_format(bytes);
  detail::MemoryBytes source(bytes);
  const detail::HeaderWalk header = walk(path, format, source, /*whole_file=*/true);
  check_size(path, header.width, header.height);
  at::Tensor picture;
  switch (format) {
    case PictureFormat::jpeg: picture = detail::decode_jpeg(path, bytes); break;
    case PictureFormat::webp: picture = detail::decode_webp(path, bytes); break;
    default: picture = detail::decode_with_stb(path, bytes); break;  // PNG (walked above) and the rest
  }
  if (picture.size(0) != header.height || picture.size(1) != header.width) {
    detail::damaged(path, "the decoder gave " + std::to_string(picture.size(1)) + " x " + std::to_string(picture.size(0)) +
                              " pixels where the header says " + std::to_string(header.width) + " x " +
                              std::to_string(header.height));
  }
  return detail::apply_exif_orientation(picture, detail::exif_orientation(header.exif));
}

ImageInfo read_image_info(const std::string& path) {
  util::require_regular_file(path, "image", "a picture");
  detail::FileBytes source(path);
  check_not_empty(path, source.size());
  const std::string first = source.read(0, 16);
  const PictureFormat format = detail::sniff_format(first);
  const detail::HeaderWalk header = walk(path, format, source, /*whole_file=*/false);
  check_size(path, header.width, header.height);
  if (header.animated) detail::damaged(path, "an animated WebP is not read (save one frame as a still picture)");
  ImageInfo info;
  info.orientation = detail::exif_orientation(header.exif);
  const bool swaps_sides = info.orientation >= 5;  // 5-8 turn the picture a quarter
  info.width = swaps_sides ? header.height : header.width;
  info.height = swaps_sides ? header.width : header.height;
  info.format = format == PictureFormat::other ? detail::stb_format_name(first) : format_name(format);
  return info;
}

}  // namespace remat::image
