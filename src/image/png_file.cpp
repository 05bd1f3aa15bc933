// PNG output of sampled pictures with their generation parameters in text chunks (libpng), and
// reading those chunks back.
//
// Note [libpng errors]
// libpng reports errors by calling an error function that must not return; the supported way out
// is longjmp to a setjmp point. A longjmp must not cross C++ frames that own resources, so each
// libpng call sequence lives in one small function (encode_png / scan_png) whose locals are
// plain pointers prepared by the caller; the caller owns every C++ object (the byte buffers, the
// text list) and turns a failure into c10::ValueError. The picture is encoded in memory and
// written with util::write_file_atomically, so a failed encode leaves no file at all.

#include "remat/image/png_file.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <png.h>

#include <ATen/ATen.h>

#include "remat/util/error.h"
#include "remat/util/files.h"

namespace remat::image {
namespace {

// Largest PNG read_png_text accepts (the chunks are scanned in memory).
constexpr uint64_t kMaxPngBytes = uint64_t{1} << 30;

struct PngJob {
  char error[256] = {0};
  // write
  const std::vector<png_bytep>* rows = nullptr;
  std::vector<png_text>* text = nullptr;
  std::string* encoded = nullptr;
  png_uint_32 width = 0, height = 0;
  int color_type = 0;
  // read
  const std::string* file = nullptr;
  size_t read_offset = 0;
  png_structp png = nullptr;
  png_infop info = nullptr;
  png_bytep row = nullptr;
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->error, sizeof(job->error), "%s", message ? message : "unknown libpng error");
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}  // e.g. a damaged ancillary chunk, skipped

void append_bytes(png_structp png, png_bytep data, png_size_t length) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  try {
    job->encoded->append(reinterpret_cast<const char*>(data), length);
  } catch (const std::bad_alloc&) {
    png_error(png, "out of memory while encoding");
  }
}

void flush_nothing(png_structp) {}

void read_bytes(png_structp png, png_bytep data, png_size_t length) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (job->file->size() - job->read_offset < length) png_error(png, "the file ends inside a chunk (truncated)");
  std::memcpy(data, job->file->data() + job->read_offset, length);
  job->read_offset += length;
}

// Note [libpng errors]: only plain locals below.
bool encode_png(PngJob* job) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, job, on_png_error, on_png_warning);
  if (png == nullptr) {
    std::snprintf(job->error, sizeof(job->error), "libpng could not start an encoder");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    if (info == nullptr) std::snprintf(job->error, sizeof(job->error), "libpng could not start an encoder");
    png_destroy_write_struct(&png, info ? &info : nullptr);
    return false;
  }
  png_set_write_fn(png, job, append_bytes, flush_nothing);
  png_set_IHDR(png, info, job->width, job->height, 8, job->color_type, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!job->text->empty()) png_set_text(png, info, job->text->data(), static_cast<int>(job->text->size()));
  png_write_info(png, info);
  png_write_image(png, const_cast<png_bytepp>(job->rows->data()));
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return true;
}

// Reads the whole PNG (every row, so the chunks after the image data are reached and the file is
// known to be whole); the caller takes the text from job->png / job->info and destroys them.
bool scan_png(PngJob* job) {
  job->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, job, on_png_error, on_png_warning);
  if (job->png == nullptr) {
    std::snprintf(job->error, sizeof(job->error), "libpng could not start a decoder");
    return false;
  }
  job->info = png_create_info_struct(job->png);
  if (job->info == nullptr) {
    std::snprintf(job->error, sizeof(job->error), "libpng could not start a decoder");
    return false;
  }
  if (setjmp(png_jmpbuf(job->png))) return false;
  png_set_read_fn(job->png, job, read_bytes);
  png_read_info(job->png, job->info);
  const int passes = png_set_interlace_handling(job->png);
  png_read_update_info(job->png, job->info);
  job->row = static_cast<png_bytep>(png_malloc(job->png, png_get_rowbytes(job->png, job->info)));
  const png_uint_32 height = png_get_image_height(job->png, job->info);
  for (int pass = 0; pass < passes; ++pass) {
    for (png_uint_32 y = 0; y < height; ++y) png_read_row(job->png, job->row, nullptr);
  }
  png_read_end(job->png, job->info);
  return true;
}

void release_reader(PngJob& job) {
  if (job.png == nullptr) return;
  if (job.row != nullptr) png_free(job.png, job.row);
  png_destroy_read_struct(&job.png, job.info ? &job.info : nullptr, nullptr);
}

// ---- text encodings: the API speaks UTF-8; tEXt / zTXt and keywords are Latin-1 ----

bool is_ascii(const std::string& s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

// Decodes UTF-8 into code points; false when `s` is not valid UTF-8.
bool utf8_code_points(const std::string& s, std::vector<uint32_t>& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
    if (n < 0 || s.size() - i < static_cast<size_t>(n) + 1) return false;  // bad lead byte, cut sequence
    uint32_t cp = n == 0 ? c : (c & (0x3Fu >> n));
    for (int k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static const uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;  // overlong, surrogate
    out.push_back(cp);
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

std::string latin1_to_utf8(const char* s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

// A PNG keyword (PNG spec §11.3.4.2): 1-79 printable Latin-1 characters, no leading, trailing or
// consecutive spaces. Returns it in Latin-1.
std::string png_keyword(const std::string& key, const std::string& path) {
  std::vector<uint32_t> cps;
  bool ok = utf8_code_points(key, cps) && !cps.empty() && cps.size() <= 79 && cps.front() != ' ' &&
            cps.back() != ' ';
  std::string latin1;
  for (size_t i = 0; ok && i < cps.size(); ++i) {
    const uint32_t cp = cps[i];
    ok = (cp >= 32 && cp <= 126) || (cp >= 161 && cp <= 255);
    ok = ok && !(cp == ' ' && i > 0 && cps[i - 1] == ' ');
    latin1 += static_cast<char>(cp);
  }
  if (!ok) {
    throw_value_error("[png] '" + path + "': PNG text key \"" + key +
                      "\" is not a PNG keyword (1-79 printable Latin-1 characters, no leading, trailing or double "
                      "spaces)");
  }
  return latin1;
}

void check_pixels(const at::Tensor& pixels, const std::string& path) {
  const bool ok = pixels.defined() && pixels.scalar_type() == at::kByte && pixels.device().is_cpu() &&
                  pixels.dim() == 3 && (pixels.size(2) == 1 || pixels.size(2) == 3 || pixels.size(2) == 4) && pixels.size(0) >= 1 &&
                  pixels.size(1) >= 1 && pixels.size(0) <= PNG_UINT_31_MAX && pixels.size(1) <= PNG_UINT_31_MAX;
  if (!ok) {
    throw_value_error("[png] '" + path + "': write_png needs uint8 CPU pixels (H, W, 1), (H, W, 3) or (H, W, 4), got " +
                      (pixels.defined() ? std::string(c10::toString(pixels.scalar_type())) + " " +
                                              c10::str(pixels.sizes()) + " on " + pixels.device().str()
                                        : std::string("none")));
  }
}

}  // namespace

void check_png_text(const PngText& text, const std::string& path) {
  std::vector<uint32_t> cps;
  for (const auto& [key, value] : text) {
    png_keyword(key, path);
    if (!utf8_code_points(value, cps)) {
      throw_value_error("[png] '" + path + "': the value of PNG text key \"" + key + "\" is not valid UTF-8");
    }
    if (value.find('\0') != std::string::npos) {
      throw_value_error("[png] '" + path + "': the value of PNG text key \"" + key +
                        "\" contains a NUL character, which PNG text cannot hold");
    }
  }
}

void write_png(const std::string& path, const at::Tensor& pixels, const PngText& text) {
  check_pixels(pixels, path);
  const at::Tensor data = pixels.contiguous();
  const int64_t height = data.size(0), width = data.size(1), channels = data.size(2);

  // Keys and values are kept alive here for libpng (Note [libpng errors]).
  std::vector<std::string> keys, values;
  std::vector<png_text> chunks(text.size());
  keys.reserve(text.size());
  values.reserve(text.size());
  check_png_text(text, path);
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& [key, value] = text[i];
    keys.push_back(png_keyword(key, path));
    values.push_back(value);
    png_text& chunk = chunks[i];
    std::memset(&chunk, 0, sizeof(chunk));
    chunk.key = keys.back().data();
    chunk.text = values.back().data();
    // Plain ASCII is valid Latin-1 (tEXt, read by every tool); anything else goes to iTXt, the
    // chunk whose text is UTF-8.
    if (is_ascii(value)) {
      chunk.compression = PNG_TEXT_COMPRESSION_NONE;
      chunk.text_length = value.size();
    } else {
      chunk.compression = PNG_ITXT_COMPRESSION_NONE;
      chunk.itxt_length = value.size();
      chunk.lang = const_cast<char*>("");
      chunk.lang_key = const_cast<char*>("");
    }
  }

  std::vector<png_bytep> rows(static_cast<size_t>(height));
  auto* base = const_cast<png_bytep>(data.data_ptr<uint8_t>());
  for (int64_t y = 0; y < height; ++y) rows[static_cast<size_t>(y)] = base + y * width * channels;

  std::string encoded;
  PngJob job;
  job.rows = &rows;
  job.text = &chunks;
  job.encoded = &encoded;
  job.width = static_cast<png_uint_32>(width);
  job.height = static_cast<png_uint_32>(height);
  job.color_type = channels == 1 ? PNG_COLOR_TYPE_GRAY : channels == 4 ? PNG_COLOR_TYPE_RGB_ALPHA : PNG_COLOR_TYPE_RGB;
  if (!encode_png(&job)) {
    throw_value_error("[png] '" + path + "': PNG encoding failed: " + job.error);
  }
  util::write_file_atomically(path, encoded, "png");
}

PngText read_png_text(const std::string& path) {
  const std::string file = util::read_regular_file(path, kMaxPngBytes, "png", "PNG file");
  if (file.size() < 8 || png_sig_cmp(reinterpret_cast<png_const_bytep>(file.data()), 0, 8) != 0) {
    throw_value_error("[png] '" + path + "' is not a PNG file (no PNG signature)");
  }
  PngJob job;
  job.file = &file;
  const bool ok = scan_png(&job);
  PngText out;
  if (ok) {
    png_textp chunks = nullptr;
    int count = 0;
    png_get_text(job.png, job.info, &chunks, &count);
    try {
      for (int i = 0; i < count; ++i) {
        const png_text& t = chunks[i];
        const bool utf8 = t.compression == PNG_ITXT_COMPRESSION_NONE || t.compression == PNG_ITXT_COMPRESSION_zTXt;
        const size_t n = utf8 ? t.itxt_length : t.text_length;
        out.emplace_back(latin1_to_utf8(t.key, std::strlen(t.key)),
                         utf8 ? std::string(t.text, n) : latin1_to_utf8(t.text, n));
      }
    } catch (...) {
      release_reader(job);
      throw;
    }
  }
  release_reader(job);
  if (!ok) throw_value_error("[png] '" + path + "' is not a readable PNG: " + job.error);
  return out;
}

}  // namespace remat::image
