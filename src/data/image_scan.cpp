// One image backend's folder, scanned as SimpleTuner's discovery does (every picture under
// instance_data_dir, recursively), without decoding a pixel: sizes come from the file headers
// (remat::image::read_image_info, EXIF orientation applied). A file that cannot be used is
// skipped with its reason, never thrown: a corrupt or zero-byte picture, a picture below
// minimum_image_size (SimpleTuner's "too_small"), an image without its caption file under the
// textfile strategy (SimpleTuner removes those from its buckets). A caption file without a picture
// is a warning.
#include <algorithm>
#include <filesystem>
#include <set>
#include <sys/stat.h>

#include <c10/util/Exception.h>

#include "string_helpers.h"
#include "remat/data/image_dataset.h"
#include "remat/image/image_file.h"
#include "remat/util/error.h"
#include "utf8.h"

namespace remat::data {
namespace {

namespace fs = std::filesystem;

using remat::detail::lower;

std::string extension_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) return "";
  return lower(path.substr(dot));
}

std::string without_extension(const std::string& path) {
  const std::string ext = extension_of(path);
  return path.substr(0, path.size() - ext.size());
}

// FNV-1a over the text, folded with the seed: the per-image random key. A different seed or a
// different path gives an unrelated key; the same pair always the same one.
uint64_t key_of(uint64_t seed, const std::string& text, uint64_t salt) {
  uint64_t h = 0xcbf29ce484222325ull ^ (seed * 0x9E3779B97F4A7C15ull) ^ salt;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

constexpr uint64_t kCropSalt = 0x63726f70;     // "crop"
constexpr uint64_t kCaptionSalt = 0x63617074;  // "capt"

}  // namespace

bool is_image_file_name(const std::string& path) {
  const std::string ext = extension_of(path);
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".webp";
}

std::map<std::pair<int64_t, int64_t>, int64_t> ScannedDataset::bucket_counts() const {
  std::map<std::pair<int64_t, int64_t>, int64_t> counts;
  for (const auto& image : images) ++counts[{image.crop.width, image.crop.height}];
  return counts;
}

ScannedDataset scan_image_dataset(const ImageDatasetConfig& config, uint64_t seed, int64_t pixel_multiple) {
  std::error_code ec;
  const fs::path root(config.instance_data_dir);
  if (!fs::exists(root, ec)) {
    throw_value_error("[data] dataset '" + config.id + "': instance_data_dir '" + config.instance_data_dir +
                      "' does not exist");
  }
  if (!fs::is_directory(root, ec)) {
    throw_value_error("[data] dataset '" + config.id + "': instance_data_dir '" + config.instance_data_dir +
                      "' is not a directory");
  }

  if (const auto bad = remat::detail::invalid_utf8_at(config.instance_data_dir)) {
    throw_value_error("[data] dataset '" + config.id + "': instance_data_dir '" +
                      remat::detail::printable_utf8(config.instance_data_dir) + "' is not valid UTF-8 (byte " +
                      std::to_string(*bad) + "); the caches index pictures by name in JSON: rename the folder");
  }

  ScannedDataset out;
  out.config = config;
  std::vector<std::string> pictures, caption_files;  // relative paths
  const auto options = fs::directory_options::follow_directory_symlink | fs::directory_options::skip_permission_denied;
  for (fs::recursive_directory_iterator it(root, options, ec), end; it != end; it.increment(ec)) {
    if (ec) {
      out.warnings.push_back({it->path().string(), "cannot be listed: " + ec.message()});
      ec.clear();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;
    const std::string relative = it->path().lexically_relative(root).generic_string();
    if (is_image_file_name(relative) && remat::detail::invalid_utf8_at(relative)) {
      out.skipped.push_back({(root / remat::detail::printable_utf8(relative)).string(),
                             "the file name is not valid UTF-8 (the caches index pictures by name in JSON): rename it"});
      continue;
    }
    if (is_image_file_name(relative)) pictures.push_back(relative);
    else if (extension_of(relative) == ".txt") caption_files.push_back(relative);
  }
  std::sort(pictures.begin(), pictures.end());
  std::sort(caption_files.begin(), caption_files.end());

  std::set<std::string> picture_stems;
  for (const auto& relative : pictures) {
    picture_stems.insert(without_extension(relative));
    const std::string path = (root / relative).string();
    ImageRecord record;
    record.path = path;
    record.relative_path = relative;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      out.skipped.push_back({path, "unreadable image: cannot stat the file"});
      continue;
    }
    record.file_size = static_cast<int64_t>(st.st_size);
    record.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
    if (record.file_size == 0) {
      out.skipped.push_back({path, "unreadable image: the file is empty"});
      continue;
    }
    try {
      const image::ImageInfo info = image::read_image_info(path);
      record.width = info.width;
      record.height = info.height;
    } catch (const c10::Error& e) {
      out.skipped.push_back({path, std::string("unreadable image: ") + e.what_without_backtrace()});
      continue;
    }
    std::string reason;
    const auto crop = plan_training_crop(record.width, record.height, config, pixel_multiple,
                                         key_of(seed, relative, kCropSalt), &reason);
    if (!crop) {
      out.skipped.push_back({path, reason});
      continue;
    }
    record.crop = *crop;
    std::string problem;
    const auto caption = caption_of(path, config, key_of(seed, relative, kCaptionSalt), &problem);
    if (!caption) {
      out.skipped.push_back({path, "no caption: " + problem});
      continue;
    }
    record.caption = *caption;
    out.images.push_back(std::move(record));
  }

  if (config.caption_strategy == CaptionStrategy::textfile) {
    for (const auto& relative : caption_files) {
      if (!picture_stems.count(without_extension(relative))) {
        out.warnings.push_back({(root / relative).string(), "caption file without an image (ignored)"});
      }
    }
  }
  return out;
}

}  // namespace remat::data
