// The byte sources of the picture readers, format sniffing and the one "damaged file" message.
#include <cstring>

#include "image_formats.h"
#include "remat/util/error.h"
#include "remat/util/files.h"

namespace remat::image::detail {
namespace {

// A picture file larger than this is refused before it is read: 2^26 pixels of uncompressed RGB
// (kMaxImagePixels) are 192 MiB, so no honest file of a readable size comes near 1 GiB.
constexpr uint64_t kMaxPictureFileBytes = uint64_t{1} << 30;

bool starts_with(std::string_view bytes, std::string_view prefix) {
  return bytes.size() >= prefix.size() && std::memcmp(bytes.data(), prefix.data(), prefix.size()) == 0;
}

}  // namespace

std::string MemoryBytes::read(uint64_t offset, uint64_t count) {
  if (offset >= bytes_.size()) return {};
  return std::string(bytes_.substr(offset, count));
}

FileBytes::FileBytes(const std::string& path) : file_(path, std::ios::binary) {
  if (!file_) throw_value_error("[image] cannot open '" + path + "'");
  file_.seekg(0, std::ios::end);
  size_ = static_cast<uint64_t>(file_.tellg());
}

std::string FileBytes::read(uint64_t offset, uint64_t count) {
  if (offset >= size_) return {};
  count = std::min(count, size_ - offset);
  std::string bytes(count, '\0');
  file_.clear();
  file_.seekg(static_cast<std::streamoff>(offset));
  file_.read(bytes.data(), static_cast<std::streamsize>(count));
  bytes.resize(static_cast<size_t>(std::max<std::streamsize>(file_.gcount(), 0)));
  return bytes;
}

std::string read_file_bytes(const std::string& path) {
  return util::read_regular_file(path, kMaxPictureFileBytes, "image", "a picture");
}

PictureFormat sniff_format(std::string_view first_bytes) {
  if (starts_with(first_bytes, "\x89PNG\r\n\x1a\n")) return PictureFormat::png;
  if (starts_with(first_bytes, "\xff\xd8")) return PictureFormat::jpeg;  // SOI, as libjpeg requires
  if (starts_with(first_bytes, "RIFF") && first_bytes.size() >= 12 && first_bytes.substr(8, 4) == "WEBP") {
    return PictureFormat::webp;
  }
  return PictureFormat::other;
}

std::string stb_format_name(std::string_view first_bytes) {
  if (starts_with(first_bytes, "BM")) return "bmp";
  if (starts_with(first_bytes, "GIF8")) return "gif";
  if (starts_with(first_bytes, "8BPS")) return "psd";
  if (starts_with(first_bytes, "#?RADIANCE") || starts_with(first_bytes, "#?RGBE")) return "hdr";
  if (first_bytes.size() >= 2 && first_bytes[0] == 'P' && (first_bytes[1] == '5' || first_bytes[1] == '6')) {
    return "pnm";
  }
  if (starts_with(first_bytes, "\x53\x80\xf6\x34")) return "pic";
  return "tga";
}

void damaged(const std::string& path, const std::string& reason) {
  throw_value_error("[image] cannot decode '" + path + "': " + reason);
}

}  // namespace remat::image::detail
