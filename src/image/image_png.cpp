// PNG files: the chunk walk (IHDR's size, the eXIf chunk, and before decoding every chunk's CRC
// and the closing IEND). stb_image decodes the pixels but verifies neither the chunks' CRCs nor
// zlib's Adler-32, so without this walk a flipped bit or a cut file could decode to wrong pixels.
#include <array>
#include <string>

#include "image_formats.h"

namespace remat::image::detail {
namespace {

uint32_t be32(const std::string& bytes, size_t at) {
  uint32_t value = 0;
  for (size_t i = 0; i < 4; ++i) value = (value << 8) | static_cast<uint8_t>(bytes[at + i]);
  return value;
}

// CRC-32 of ISO 3309 / ITU-T V.42 (the PNG specification's CRC, reflected polynomial 0xEDB88320).
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> entries{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      entries[n] = c;
    }
    return entries;
  }();
  return table;
}

uint32_t crc32_of(std::string_view type, std::string_view data) {
  const auto& table = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (std::string_view part : {type, data}) {
    for (char byte : part) c = table[(c ^ static_cast<uint8_t>(byte)) & 0xFF] ^ (c >> 8);
  }
  return c ^ 0xFFFFFFFFu;
}

// The PNG specification limits chunk lengths (and sizes) to 2^31 - 1.
constexpr uint32_t kMaxPngLength = 0x7FFFFFFFu;

}  // namespace

HeaderWalk walk_png(const std::string& path, ByteSource& bytes, bool check_crcs) {
  HeaderWalk walk;
  const std::string header = bytes.read(8, 8 + 13);
  if (header.size() < 8 + 13 || header.compare(4, 4, "IHDR") != 0 || be32(header, 0) != 13) {
    damaged(path, "the PNG file has no complete IHDR chunk after its signature");
  }
  walk.width = be32(header, 8);
  walk.height = be32(header, 12);
  if (walk.width == 0 || walk.height == 0 || walk.width > kMaxPngLength || walk.height > kMaxPngLength) {
    damaged(path, "the PNG header gives a size of " + std::to_string(walk.width) + " x " + std::to_string(walk.height));
  }
  uint64_t offset = 8;
  for (;;) {
    const std::string chunk = bytes.read(offset, 8);
    if (chunk.size() < 8) damaged(path, "the PNG file ends before its IEND chunk (truncated)");
    const uint32_t length = be32(chunk, 0);
    const std::string type = chunk.substr(4, 4);
    if (length > kMaxPngLength) damaged(path, "corrupt PNG: chunk '" + type + "' claims " + std::to_string(length) + " bytes");
    if (offset + 12 + length > bytes.size()) {
      damaged(path, "the PNG file ends inside its '" + type + "' chunk (truncated)");
    }
    const bool is_exif = type == "eXIf" && walk.exif.empty() && length <= kMaxExifBytes;
    if (check_crcs || is_exif) {
      const std::string body = bytes.read(offset + 8, uint64_t{length} + 4);
      const std::string_view data = std::string_view(body).substr(0, length);
      if (check_crcs && crc32_of(type, data) != be32(body, length)) {
        damaged(path, "corrupt PNG: the CRC of chunk '" + type + "' at byte " + std::to_string(offset) + " is wrong");
      }
      if (is_exif) walk.exif = std::string(data);
    }
    if (type == "IEND") return walk;
    offset += 12 + uint64_t{length};
  }
}

}  // namespace remat::image::detail
