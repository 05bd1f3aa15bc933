// JPEG files: the marker walk for the header (size, Exif segment) and the decoder, Debian's
// libjpeg-turbo with its default settings (islow IDCT, fancy upsampling), the decoder PIL uses,
// so a picture's pixels are the ones SimpleTuner trains on.
#include <csetjmp>
#include <cstdio>
#include <string>

#include <jpeglib.h>
#include <jerror.h>

#include "image_formats.h"
#include "remat/image/image_file.h"

namespace remat::image::detail {
namespace {

uint32_t be16(const std::string& bytes, size_t at) {
  return (uint32_t{static_cast<uint8_t>(bytes[at])} << 8) | static_cast<uint8_t>(bytes[at + 1]);
}

// Start-of-frame markers: SOF0-SOF15 except DHT (C4), JPG (C8) and DAC (CC).
bool is_frame_header(uint8_t marker) {
  return marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
}

// libjpeg reports damage in two ways: errors (longjmp out, below) and warnings, after which it
// carries on and fills what it could not decode with grey. These warnings mean missing or wrong
// pixels, so they refuse the file like errors do; the others (extraneous bytes between markers,
// an unknown JFIF revision or Adobe transform, a bad ICC marker) leave every pixel intact.
bool warning_means_lost_pixels(int code) {
  switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
    case JWRN_MUST_RESYNC:
    case JWRN_BOGUS_PROGRESSION:
      return true;
    default:
      return false;
  }
}

// One decompression: the libjpeg state, its error handler and where to jump on failure. The
// functions that call setjmp hold no C++ object with a destructor, so the longjmp skips none.
struct JpegSession {
  jpeg_decompress_struct info{};
  jpeg_error_mgr errors{};
  std::jmp_buf failure{};
  char message[JMSG_LENGTH_MAX] = {};

  JpegSession() {
    info.err = jpeg_std_error(&errors);
    errors.error_exit = &JpegSession::on_error;
    errors.emit_message = &JpegSession::on_message;
    info.client_data = this;
  }
  ~JpegSession() { jpeg_destroy_decompress(&info); }
  JpegSession(const JpegSession&) = delete;
  JpegSession& operator=(const JpegSession&) = delete;

  static void fail(j_common_ptr common) {
    auto* session = static_cast<JpegSession*>(common->client_data);
    (*common->err->format_message)(common, session->message);
    std::longjmp(session->failure, 1);
  }
  static void on_error(j_common_ptr common) { fail(common); }
  static void on_message(j_common_ptr common, int level) {
    if (level == -1 && warning_means_lost_pixels(common->err->msg_code)) fail(common);
  }
};

bool start(JpegSession& session, const unsigned char* data, unsigned long size) {
  if (setjmp(session.failure) != 0) return false;
  jpeg_create_decompress(&session.info);
  jpeg_mem_src(&session.info, data, size);
  jpeg_read_header(&session.info, TRUE);
  return true;
}

bool read_pixels(JpegSession& session, J_COLOR_SPACE colour_space, unsigned char* out, size_t row_bytes) {
  if (setjmp(session.failure) != 0) return false;
  session.info.out_color_space = colour_space;
  jpeg_start_decompress(&session.info);
  while (session.info.output_scanline < session.info.output_height) {
    JSAMPROW row = out + session.info.output_scanline * row_bytes;
    jpeg_read_scanlines(&session.info, &row, 1);
  }
  jpeg_finish_decompress(&session.info);
  return true;
}

}  // namespace

HeaderWalk walk_jpeg(const std::string& path, ByteSource& bytes) {
  HeaderWalk walk;
  uint64_t offset = 2;  // after SOI (checked by sniff_format)
  for (;;) {
    const std::string marker = bytes.read(offset, 4);
    if (marker.size() < 2) damaged(path, "the JPEG file ends before its frame header (truncated)");
    if (static_cast<uint8_t>(marker[0]) != 0xFF) {
      damaged(path, "corrupt JPEG: no marker at byte " + std::to_string(offset));
    }
    const auto code = static_cast<uint8_t>(marker[1]);
    if (code == 0xFF) {  // a fill byte before the marker
      offset += 1;
      continue;
    }
    if (code == 0x01 || (code >= 0xD0 && code <= 0xD7)) {  // markers without a length
      offset += 2;
      continue;
    }
    if (code == 0xD9 || code == 0xDA) damaged(path, "corrupt JPEG: no frame header before the image data");
    if (marker.size() < 4) damaged(path, "the JPEG file ends inside a marker (truncated)");
    const uint32_t length = be16(marker, 2);
    if (length < 2) damaged(path, "corrupt JPEG: a marker segment of length " + std::to_string(length));
    if (code == 0xE1 && walk.exif.empty()) {
      std::string segment = bytes.read(offset + 4, length - 2);
      if (segment.compare(0, 6, std::string("Exif\0\0", 6)) == 0) walk.exif = std::move(segment);
    }
    if (is_frame_header(code)) {
      const std::string frame = bytes.read(offset + 4, 5);
      if (frame.size() < 5) damaged(path, "the JPEG file ends inside its frame header (truncated)");
      walk.height = be16(frame, 1);
      walk.width = be16(frame, 3);
      if (walk.width == 0 || walk.height == 0) {
        damaged(path, "the JPEG frame header gives a size of " + std::to_string(walk.width) + " x " +
                          std::to_string(walk.height) + " (a height set later by a DNL marker is not supported)");
      }
      return walk;
    }
    offset += 2 + length;
  }
}

// uint8 [h, w, 4] CMYK as libjpeg decodes it -> uint8 [h, w, 3] RGB as PIL converts it. PIL reads
// every four-component JPEG as Adobe's inverted CMYK (what Photoshop writes), then takes
// R = (255 - K) - C (255 - K) / 255 per channel, with C, K the un-inverted values; here v is the
// stored value, so 255 - K = v_K and C = 255 - v_C, rounded as PIL's MULDIV255 rounds.
at::Tensor inverted_cmyk_to_rgb(const at::Tensor& cmyk) {
  auto rgb = at::empty({cmyk.size(0), cmyk.size(1), 3}, at::kByte);
  const uint8_t* in = cmyk.data_ptr<uint8_t>();
  uint8_t* out = rgb.data_ptr<uint8_t>();
  const int64_t pixels = cmyk.size(0) * cmyk.size(1);
  for (int64_t p = 0; p < pixels; ++p, in += 4, out += 3) {
    const int not_black = in[3];
    for (int c = 0; c < 3; ++c) {
      const int product = (255 - in[c]) * not_black + 128;
      const int value = not_black - (((product >> 8) + product) >> 8);
      out[c] = static_cast<uint8_t>(value < 0 ? 0 : value > 255 ? 255 : value);
    }
  }
  return rgb;
}

at::Tensor decode_jpeg(const std::string& path, std::string_view bytes) {
  JpegSession session;
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  if (!start(session, data, bytes.size())) damaged(path, std::string("JPEG: ") + session.message);
  const J_COLOR_SPACE stored = session.info.jpeg_color_space;
  const bool cmyk = stored == JCS_CMYK || stored == JCS_YCCK;
  const int64_t width = session.info.image_width, height = session.info.image_height;
  if (width * height > kMaxImagePixels) {
    damaged(path, "the JPEG is " + std::to_string(width) + " x " + std::to_string(height) + " pixels; at most " +
                      std::to_string(kMaxImagePixels) + " pixels are read");
  }
  const int64_t channels = cmyk ? 4 : 3;
  auto picture = at::empty({height, width, channels}, at::kByte);
  if (!read_pixels(session, cmyk ? JCS_CMYK : JCS_RGB, picture.data_ptr<uint8_t>(),
                   static_cast<size_t>(width * channels))) {
    damaged(path, std::string("JPEG: ") + session.message);
  }
  return cmyk ? inverted_cmyk_to_rgb(picture) : picture;
}

}  // namespace remat::image::detail
