#include "image_test_files.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <cstdio>

#include <jpeglib.h>
#include <libexif/exif-data.h>
#include <webp/encode.h>

#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

namespace remat::image::testing {
namespace {

void append_be32(std::string& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((value >> shift) & 0xFF));
}
void append_le(std::string& out, uint32_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

// The PNG specification's CRC, bit by bit (remat's reader uses a table).
uint32_t png_crc(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void collect(void* context, void* data, int size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data), static_cast<size_t>(size));
}

std::string riff(const std::string& chunks) {
  std::string out = "RIFF";
  append_le(out, static_cast<uint32_t>(4 + chunks.size()), 4);
  return out + "WEBP" + chunks;
}

std::string chunk(const std::string& fourcc, const std::string& payload) {
  std::string out = fourcc;
  append_le(out, static_cast<uint32_t>(payload.size()), 4);
  out += payload;
  if (payload.size() % 2 == 1) out.push_back('\0');
  return out;
}

std::string vp8x(uint8_t flags, int64_t width, int64_t height) {
  std::string payload(1, static_cast<char>(flags));
  payload.append(3, '\0');
  append_le(payload, static_cast<uint32_t>(width - 1), 3);
  append_le(payload, static_cast<uint32_t>(height - 1), 3);
  return chunk("VP8X", payload);
}

// The image chunk ("VP8L" and its payload) of a simple-format WebP: everything after "WEBP".
std::string image_chunk_of(const std::string& webp) { return webp.substr(12); }

}  // namespace

std::string read_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

at::Tensor smooth_picture(int64_t height, int64_t width) {
  auto y = at::arange(height, at::kDouble).view({height, 1, 1}) / height;
  auto x = at::arange(width, at::kDouble).view({1, width, 1}) / width;
  auto c = at::arange(3, at::kDouble).view({1, 1, 3});
  // Red follows x, green y, blue a mix: every pixel's neighbourhood tells where it is.
  auto value = at::where(c == 0, x * 200 + 30, at::where(c == 1, y * 200 + 30, (x + y) * 90 + 40));
  return value.round().to(at::kByte).contiguous();
}

std::string jpeg_of(const at::Tensor& picture, int quality) {
  std::string out;
  const auto p = picture.contiguous();
  if (!stbi_write_jpg_to_func(&collect, &out, static_cast<int>(p.size(1)), static_cast<int>(p.size(0)),
                              static_cast<int>(p.size(2)), p.data_ptr<uint8_t>(), quality)) {
    throw std::runtime_error("stbi_write_jpg failed");
  }
  return out;
}

std::string cmyk_jpeg_of(const at::Tensor& cmyk, int quality) {
  const auto p = cmyk.contiguous();
  jpeg_compress_struct info{};
  jpeg_error_mgr errors{};
  info.err = jpeg_std_error(&errors);  // errors exit the test program: inputs here are valid
  jpeg_create_compress(&info);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&info, &buffer, &size);
  info.image_width = static_cast<JDIMENSION>(p.size(1));
  info.image_height = static_cast<JDIMENSION>(p.size(0));
  info.input_components = 4;
  info.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = p.data_ptr<uint8_t>() + info.next_scanline * p.size(1) * 4;
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  std::string out(reinterpret_cast<const char*>(buffer), size);
  jpeg_destroy_compress(&info);
  std::free(buffer);
  return out;
}

std::string bmp_of(const at::Tensor& picture) {
  std::string out;
  const auto p = picture.contiguous();
  if (!stbi_write_bmp_to_func(&collect, &out, static_cast<int>(p.size(1)), static_cast<int>(p.size(0)),
                              static_cast<int>(p.size(2)), p.data_ptr<uint8_t>())) {
    throw std::runtime_error("stbi_write_bmp failed");
  }
  return out;
}

std::string lossless_webp_of(const at::Tensor& picture) {
  const auto p = picture.contiguous();
  const int width = static_cast<int>(p.size(1)), height = static_cast<int>(p.size(0));
  const int channels = static_cast<int>(p.size(2));
  uint8_t* output = nullptr;
  const size_t size = channels == 4
                          ? WebPEncodeLosslessRGBA(p.data_ptr<uint8_t>(), width, height, width * 4, &output)
                          : WebPEncodeLosslessRGB(p.data_ptr<uint8_t>(), width, height, width * 3, &output);
  if (size == 0) throw std::runtime_error("WebPEncodeLossless failed");
  std::string out(reinterpret_cast<const char*>(output), size);
  WebPFree(output);
  return out;
}

std::string exif_block(int orientation, bool big_endian) {
  ExifData* data = exif_data_new();
  const ExifByteOrder order = big_endian ? EXIF_BYTE_ORDER_MOTOROLA : EXIF_BYTE_ORDER_INTEL;
  exif_data_set_byte_order(data, order);
  ExifEntry* entry = exif_entry_new();
  exif_content_add_entry(data->ifd[EXIF_IFD_0], entry);
  exif_entry_initialize(entry, EXIF_TAG_ORIENTATION);
  exif_set_short(entry->data, order, static_cast<ExifShort>(orientation));
  exif_entry_unref(entry);
  unsigned char* bytes = nullptr;
  unsigned int size = 0;
  exif_data_save_data(data, &bytes, &size);
  exif_data_unref(data);
  if (bytes == nullptr) throw std::runtime_error("exif_data_save_data failed");
  std::string out(reinterpret_cast<const char*>(bytes), size);
  std::free(bytes);
  return out;
}

std::string jpeg_with_exif(const std::string& jpeg, const std::string& exif) {
  std::string segment = "\xff\xe1";
  segment.push_back(static_cast<char>(((exif.size() + 2) >> 8) & 0xFF));
  segment.push_back(static_cast<char>((exif.size() + 2) & 0xFF));
  return jpeg.substr(0, 2) + segment + exif + jpeg.substr(2);
}

std::string png_with_exif(const std::string& png, const std::string& exif) {
  const std::string tiff = exif.substr(6);  // eXIf holds the TIFF data without "Exif\0\0"
  std::string chunk_bytes;
  append_be32(chunk_bytes, static_cast<uint32_t>(tiff.size()));
  chunk_bytes += "eXIf" + tiff;
  append_be32(chunk_bytes, png_crc("eXIf" + tiff));
  const size_t after_ihdr = 8 + 4 + 4 + 13 + 4;
  return png.substr(0, after_ihdr) + chunk_bytes + png.substr(after_ihdr);
}

std::string webp_with_exif(const std::string& webp, int64_t width, int64_t height, const std::string& exif) {
  // VP8X flags: bit 3 (0x08) says an EXIF chunk follows the image data.
  return riff(vp8x(0x08, width, height) + image_chunk_of(webp) + chunk("EXIF", exif.substr(6)));
}

std::string animated_webp(const std::string& webp, int64_t width, int64_t height) {
  std::string anim;
  append_le(anim, 0, 4);  // background colour
  append_le(anim, 0, 2);  // loop forever
  std::string frame;
  append_le(frame, 0, 3);  // x / 2
  append_le(frame, 0, 3);  // y / 2
  append_le(frame, static_cast<uint32_t>(width - 1), 3);
  append_le(frame, static_cast<uint32_t>(height - 1), 3);
  append_le(frame, 100, 3);  // duration in ms
  frame.push_back('\0');      // flags
  frame += image_chunk_of(webp);
  // VP8X flags: bit 1 (0x02) says the file is an animation.
  return riff(vp8x(0x02, width, height) + chunk("ANIM", anim) + chunk("ANMF", frame) + chunk("ANMF", frame));
}

}  // namespace remat::image::testing
