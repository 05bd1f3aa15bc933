// Cache entries on disk: where each lives, the metadata that makes it current, and the clean-up
// of writes an interrupted run left behind.
#include <filesystem>

#include <c10/util/Exception.h>

#include "caches_internal.h"
#include "remat/io/safetensors.h"

namespace remat::data::detail {
namespace fs = std::filesystem;

namespace {
// Bumped when the meaning of an entry changes, so old entries become stale rather than misread.
constexpr const char* kImageFormat = "remat-vae-latents-1";
constexpr const char* kTextFormat = "remat-text-embeds-1";
}  // namespace

Metadata image_entry_metadata(const ImageRecord& record, const std::string& encoder_identity) {
  const auto& c = record.crop;
  return {{"remat.cache", kImageFormat},
          {"remat.source", record.path},
          {"remat.source_size", std::to_string(record.file_size)},
          {"remat.source_mtime_ns", std::to_string(record.mtime_ns)},
          {"remat.resized", std::to_string(c.resized_width) + "x" + std::to_string(c.resized_height)},
          {"remat.crop", std::to_string(c.crop_left) + "," + std::to_string(c.crop_top) + "," +
                             std::to_string(c.width) + "x" + std::to_string(c.height)},
          {"remat.bucket", std::to_string(c.width) + "x" + std::to_string(c.height)},
          {"remat.encoder", encoder_identity}};
}

Metadata text_entry_metadata(const std::string& caption, const std::string& encoder_identity) {
  return {{"remat.cache", kTextFormat}, {"remat.caption", caption}, {"remat.encoder", encoder_identity}};
}

std::string text_entry_path(const std::string& dir, const std::string& caption, const std::string& encoder_identity) {
  return (fs::path(dir) / (fnv1a_128_hex(encoder_identity + '\0' + caption) + ".safetensors")).string();
}

std::string image_entry_path(const std::string& dir, const ImageRecord& record) {
  return (fs::path(dir) / (record.relative_path + ".safetensors")).string();
}

bool entry_is_current(const std::string& path, const Metadata& expected, const std::vector<std::string>& keys) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  try {
    const auto file = io::SafetensorsFile::open(path);
    for (const auto& key : keys) {
      if (!file.contains(key)) return false;
    }
    const auto& metadata = file.metadata();
    for (const auto& [key, value] : expected) {
      const auto it = metadata.find(key);
      if (it == metadata.end() || it->second != value) return false;
    }
    return true;
  } catch (const c10::Error&) {
    return false;  // truncated or not a safetensors file: re-encoded and replaced whole
  }
}

int64_t remove_interrupted_writes(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  std::vector<fs::path> leftovers;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // ".<entry>.safetensors.tmp.XXXXXX": mkstemp's six characters after ".tmp.".
    const std::string marker = ".safetensors.tmp.";
    const auto at = name.rfind(marker);
    if (name.size() > 1 && name[0] == '.' && at != std::string::npos && at > 1 &&
        name.size() == at + marker.size() + 6) {
      leftovers.push_back(it->path());
    }
  }
  int64_t removed = 0;
  for (const auto& path : leftovers) removed += fs::remove(path, ec) ? 1 : 0;
  return removed;
}

}  // namespace remat::data::detail
