#pragma once
// The picture formats behind read_image and read_image_info (private to remat_encoders): each
// format's header walk (size, EXIF block) over a ByteSource, so the same code serves the header
// look-up (reads a few hundred bytes of the file) and the decoder (the whole file in memory), and
// each format's decoder.

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

#include <ATen/ATen.h>

namespace remat::image::detail {

/// Random access to a picture's bytes: a file read on demand, or a file already in memory.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  /// The `count` bytes at `offset`, fewer where the source ends first.
  virtual std::string read(uint64_t offset, uint64_t count) = 0;
};

class MemoryBytes final : public ByteSource {
 public:
  explicit MemoryBytes(std::string_view bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  std::string read(uint64_t offset, uint64_t count) override;

 private:
  std::string_view bytes_;
};

class FileBytes final : public ByteSource {
 public:
  /// Opens `path` (already checked to be a regular file); throws c10::ValueError naming it.
  explicit FileBytes(const std::string& path);
  uint64_t size() const override { return size_; }
  std::string read(uint64_t offset, uint64_t count) override;

 private:
  std::ifstream file_;
  uint64_t size_ = 0;
};

/// The whole file, after the checks of util::require_regular_file; throws c10::ValueError naming it.
std::string read_file_bytes(const std::string& path);

enum class PictureFormat { png, jpeg, webp, other };

/// The format by the file's first bytes (never by its name).
PictureFormat sniff_format(std::string_view first_bytes);

/// What a header walk finds: the stored size and the raw EXIF block, if any.
struct HeaderWalk {
  int64_t width = 0;
  int64_t height = 0;
  std::string exif;      ///< the EXIF block (TIFF data, with or without the "Exif\0\0" prefix)
  bool animated = false; ///< WebP only
};

/// The largest EXIF block read; a larger one is ignored (the picture is read as stored).
inline constexpr uint64_t kMaxExifBytes = uint64_t{1} << 20;

/// Throws c10::ValueError "[image] cannot decode '<path>': <reason>".
[[noreturn]] void damaged(const std::string& path, const std::string& reason);

// ---- JPEG (libjpeg-turbo) ----
/// Markers from SOI to the frame header: the size and the first APP1 Exif segment.
HeaderWalk walk_jpeg(const std::string& path, ByteSource& bytes);
/// uint8 [height, width, 3] as stored (no EXIF orientation applied).
at::Tensor decode_jpeg(const std::string& path, std::string_view bytes);

// ---- PNG (chunk walk here, pixels by stb_image) ----
/// IHDR's size and the eXIf chunk. With `check_crcs` every chunk is read and its CRC checked, and
/// the walk must reach IEND: a damaged or truncated file is refused before stb decodes it (stb
/// checks neither CRCs nor zlib's Adler-32, so a flipped bit would otherwise pass silently).
HeaderWalk walk_png(const std::string& path, ByteSource& bytes, bool check_crcs);

// ---- WebP (libwebp) ----
/// The size (WebPGetFeatures), whether it is animated, and the EXIF chunk of an extended file.
HeaderWalk walk_webp(const std::string& path, ByteSource& bytes);
/// uint8 [height, width, 3] (alpha dropped). Throws for an animated file.
at::Tensor decode_webp(const std::string& path, std::string_view bytes);

// ---- the other formats stb_image reads ----
/// "bmp", "gif", "psd", "hdr", "pnm", "pic" by magic bytes, "tga" otherwise (TGA has none).
std::string stb_format_name(std::string_view first_bytes);
/// The size from stb's header reader; throws "not a picture remat can read" when stb knows none.
HeaderWalk stb_header(const std::string& path, std::string_view bytes);
at::Tensor decode_with_stb(const std::string& path, std::string_view bytes);

// ---- EXIF (libexif) ----
/// The orientation tag (0x0112) of IFD0 in an EXIF block; 1 when absent, damaged or not 1-8.
int exif_orientation(const std::string& exif);
/// The upright picture: the transform of ImageOps.exif_transpose for `orientation` (1-8).
at::Tensor apply_exif_orientation(const at::Tensor& picture, int orientation);

}  // namespace remat::image::detail
