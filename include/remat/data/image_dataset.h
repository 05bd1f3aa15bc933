#pragma once
/// \file
/// A folder of pictures with captions, as SimpleTuner reads one: every image found (PNG, JPEG,
/// WebP, recursively, sorted by path), its caption by the backend's caption_strategy, its size as
/// displayed (after EXIF orientation), and the resize and crop that put it in its aspect bucket.
/// Nothing here decodes pixels: sizes come from file headers, so a scan of thousands of images
/// takes seconds. Bad files are skipped with a reason and counted, never thrown.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "remat/data/dataset_config.h"
#include "remat/export.h"

namespace remat::data {

/// How one image becomes a training picture: resize the (EXIF-upright) image to
/// resized_width x resized_height with the high-quality filter, then take the crop box
/// (crop_left, crop_top, width, height) of the resized image. width x height is the bucket:
/// both multiples of the pixel multiple (16 for Flux: VAE factor 8 x 2x2 packing).
struct TrainingCrop {
  int64_t resized_width = 0;
  int64_t resized_height = 0;
  int64_t crop_left = 0;
  int64_t crop_top = 0;
  int64_t width = 0;   ///< the bucket's width
  int64_t height = 0;  ///< the bucket's height

  bool operator==(const TrainingCrop& other) const;
};

/// The crop for an upright image of `width` x `height` pixels under `config` (resolution,
/// resolution_type, maximum_image_size / target_downsample_size, crop, crop_style, crop_aspect),
/// with bucket sides multiples of `pixel_multiple`. `random_key` decides random crops (the same
/// key gives the same crop). std::nullopt when the image is below minimum_image_size (then
/// `skip_reason`, if given, says why, with the figures).
REMAT_API std::optional<TrainingCrop> plan_training_crop(int64_t width, int64_t height,
                                                         const ImageDatasetConfig& config,
                                                         int64_t pixel_multiple, uint64_t random_key,
                                                         std::string* skip_reason = nullptr);

/// One usable image of a dataset.
struct ImageRecord {
  std::string path;           ///< as found under instance_data_dir
  std::string relative_path;  ///< relative to instance_data_dir (names its cache entry)
  int64_t file_size = 0;
  int64_t mtime_ns = 0;       ///< modification time, ns since the epoch
  int64_t width = 0;          ///< upright width (EXIF orientation applied)
  int64_t height = 0;
  std::string caption;        ///< after caption_strategy, instance_prompt rules
  TrainingCrop crop;
};

/// What a scan skipped, by reason, with the files (for the summary and warnings).
struct ScanProblem {
  std::string path;
  std::string reason;  ///< "unreadable image: ...", "below minimum_image_size: ...", ...
};

/// FLUX.1 Kontext's reference pictures of a scanned dataset: its conditioning dataset, and for
/// every image of the dataset, in the same order, the picture at the same relative path in the
/// conditioning dataset's folder, with the crop its conditioning_type gives it.
struct ReferenceSet {
  ImageDatasetConfig config;        ///< the conditioning dataset
  std::vector<ImageRecord> images;  ///< images[i] is the reference of the dataset's images[i]
};

/// One scanned image backend.
struct ScannedDataset {
  ImageDatasetConfig config;
  std::vector<ImageRecord> images;   ///< sorted by relative_path
  std::vector<ScanProblem> skipped;  ///< images left out (too small, corrupt, no caption)
  std::vector<ScanProblem> warnings; ///< kept images with a remark; caption files without an image
  /// Set when the dataset is paired with a conditioning dataset (pair_references).
  std::optional<ReferenceSet> references;
  /// Images per bucket (width, height), for the start-of-run report.
  std::map<std::pair<int64_t, int64_t>, int64_t> bucket_counts() const;
};

/// Scans config.instance_data_dir. Random crops are decided once per image from (seed, the
/// image's relative path). Throws c10::ValueError only when the directory is missing or not a
/// directory; a dataset with no usable image is returned empty (the caller decides).
REMAT_API ScannedDataset scan_image_dataset(const ImageDatasetConfig& config, uint64_t seed,
                                            int64_t pixel_multiple);

/// Pairs every image of `edits` with its reference picture in `conditioning` (a conditioning
/// dataset, scanned here), as SimpleTuner pairs Kontext datasets: the same relative path, name and
/// extension. reference_strict: the reference is resized to the edit's resized size and cut by the
/// edit's crop box (SimpleTuner duplicates the edit's crop metadata); reference_loose: it is
/// bucketed and cropped on its own by `conditioning`'s settings. An edit picture without a usable
/// reference moves to edits.skipped with the reason (no picture at the path, or why it is
/// unusable); references no edit uses are counted in edits.warnings. Sets edits.references.
REMAT_API void pair_references(ScannedDataset& edits, const ImageDatasetConfig& conditioning, uint64_t seed,
                               int64_t pixel_multiple);

/// The caption of `image_path` under `config`'s caption_strategy, instance_prompt,
/// prepend_instance_prompt and only_instance_prompt, or std::nullopt with `problem` set when it has
/// none (textfile strategy and no readable IMAGE.txt, an empty caption). With a multi-line text
/// file every line is a caption variant; variant `variant_key % lines` is used.
REMAT_API std::optional<std::string> caption_of(const std::string& image_path, const ImageDatasetConfig& config,
                                                uint64_t variant_key, std::string* problem);

/// True when `path` names a file of a picture format remat decodes (.png, .jpg, .jpeg, .webp, any case).
REMAT_API bool is_image_file_name(const std::string& path);

}  // namespace remat::data
