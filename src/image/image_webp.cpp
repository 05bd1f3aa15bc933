// WebP files, with Debian's libwebp: the header (WebPGetFeatures), the EXIF chunk of an extended
// file, and the decoder. An animated WebP is refused with a clear error rather than read as its
// first frame: a dataset picture that moves is more likely a mistake than a still to train on.
#include <string>

#include <webp/decode.h>

#include "image_formats.h"
#include "remat/image/image_file.h"

namespace remat::image::detail {
namespace {

uint32_t le32(const std::string& bytes, size_t at) {
  uint32_t value = 0;
  for (size_t i = 4; i-- > 0;) value = (value << 8) | static_cast<uint8_t>(bytes[at + i]);
  return value;
}

std::string status_text(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "corrupt WebP data";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "a WebP feature libwebp does not support";
    case VP8_STATUS_SUSPENDED: return "decoding suspended";
    case VP8_STATUS_USER_ABORT: return "decoding aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "the WebP file is truncated";
    default: return "WebP status " + std::to_string(static_cast<int>(status));
  }
}

// The prefix WebPGetFeatures is first given: enough for the RIFF header, VP8X and the bitstream's
// own header unless a large ICC profile comes first (then the whole file is read).
constexpr uint64_t kFeaturesPrefix = 64 * 1024;

constexpr uint8_t kVp8xExifFlag = 0x08;

}  // namespace

HeaderWalk walk_webp(const std::string& path, ByteSource& bytes) {
  HeaderWalk walk;
  std::string head = bytes.read(0, kFeaturesPrefix);
  WebPBitstreamFeatures features;
  VP8StatusCode status = WebPGetFeatures(reinterpret_cast<const uint8_t*>(head.data()), head.size(), &features);
  if (status == VP8_STATUS_NOT_ENOUGH_DATA && bytes.size() > head.size()) {
    head = bytes.read(0, bytes.size());
    status = WebPGetFeatures(reinterpret_cast<const uint8_t*>(head.data()), head.size(), &features);
  }
  if (status != VP8_STATUS_OK) damaged(path, status_text(status));
  // The RIFF header's size: a file shorter than it says is cut, whatever the decoder could guess.
  const uint64_t riff_end = uint64_t{le32(head, 4)} + 8;
  if (bytes.size() < riff_end) damaged(path, "the WebP file is truncated (" + std::to_string(bytes.size()) +
                                                 " of " + std::to_string(riff_end) + " bytes)");
  walk.width = features.width;
  walk.height = features.height;
  walk.animated = features.has_animation != 0;
  // Extended files (VP8X) flag an EXIF chunk, which comes after the image data: walk the chunks.
  if (head.compare(12, 4, "VP8X") == 0 && head.size() > 20 && (static_cast<uint8_t>(head[20]) & kVp8xExifFlag)) {
    uint64_t offset = 12;
    while (offset + 8 <= riff_end) {
      const std::string chunk = bytes.read(offset, 8);
      const uint32_t size = le32(chunk, 4);
      if (chunk.compare(0, 4, "EXIF") == 0) {
        if (size <= kMaxExifBytes) walk.exif = bytes.read(offset + 8, size);
        break;
      }
      offset += 8 + uint64_t{size} + (size & 1);  // chunks are padded to an even size
    }
  }
  return walk;
}

at::Tensor decode_webp(const std::string& path, std::string_view bytes) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) damaged(path, "libwebp does not match the version remat was built with");
  VP8StatusCode status = WebPGetFeatures(data, bytes.size(), &config.input);
  if (status != VP8_STATUS_OK) damaged(path, status_text(status));
  if (config.input.has_animation) {
    damaged(path, "an animated WebP is not read (save one frame as a still picture)");
  }
  const int64_t width = config.input.width, height = config.input.height;
  if (width * height > kMaxImagePixels) {
    damaged(path, "the WebP is " + std::to_string(width) + " x " + std::to_string(height) + " pixels; at most " +
                      std::to_string(kMaxImagePixels) + " pixels are read");
  }
  auto picture = at::empty({height, width, 3}, at::kByte);
  // Decoded straight into the tensor (alpha, if any, is dropped as PIL's convert("RGB") does).
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = picture.data_ptr<uint8_t>();
  config.output.u.RGBA.stride = static_cast<int>(width * 3);
  config.output.u.RGBA.size = static_cast<size_t>(picture.numel());
  status = WebPDecode(data, bytes.size(), &config);
  WebPFreeDecBuffer(&config.output);
  if (status != VP8_STATUS_OK) damaged(path, status_text(status));
  return picture;
}

}  // namespace remat::image::detail
