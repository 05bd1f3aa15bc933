#pragma once
/// \file
/// SimpleTuner's dataset configuration: the `--data_backend_config` file (multidatabackend.json, a
/// JSON list of backends) and the single-folder shortcut `--instance_data_dir DIR` with the global
/// data options. Same key names and meanings as SimpleTuner's
/// https://github.com/bghira/SimpleTuner/blob/main/documentation/DATALOADER.md; what
/// remat does not implement is warned about (keys that do not change the result) or refused
/// (backend types, values). Everything here is checked before any model is loaded.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "remat/export.h"

namespace remat::data {

/// How `resolution` (and minimum_image_size, maximum_image_size, target_downsample_size) is measured.
enum class ResolutionType {
  pixel,       ///< the shorter edge, in pixels
  area,        ///< the area, in megapixels
  pixel_area,  ///< the area, given as the side of a square in pixels (1024 -> 1024^2 pixels)
};

enum class CaptionStrategy {
  filename,        ///< the image's file name without extension (SimpleTuner's clean-up rules)
  textfile,        ///< IMAGE.txt beside the image; one caption per line
  instanceprompt,  ///< the backend's instance_prompt for every image
};

enum class CropStyle { center, random, corner };
enum class CropAspect { square, preserve, closest };

/// Bounds of a dataset's numbers, checked where they are read: SimpleTuner's examples use repeats
/// of a few to a few hundred, so a million is a typo's scale, not a dataset's; a pixel edge (or
/// the edge of pixel_area's square) is at most remat::encoders' picture bound (8192 x 8192); an
/// area at most its 64 megapixels.
inline constexpr int64_t kMaxRepeats = 1'000'000;
inline constexpr double kMaxResolutionPixels = 8192;
inline constexpr double kMaxResolutionMegapixels = 64;

/// One `"type": "local"` image backend (dataset_type "image", the default).
struct ImageDatasetConfig {
  std::string id;
  std::string instance_data_dir;
  CaptionStrategy caption_strategy = CaptionStrategy::filename;
  std::optional<std::string> instance_prompt;
  bool prepend_instance_prompt = false;
  bool only_instance_prompt = false;
  double resolution = 1024;
  ResolutionType resolution_type = ResolutionType::pixel_area;
  std::optional<double> minimum_image_size;      ///< in resolution_type's unit
  std::optional<double> maximum_image_size;      ///< in resolution_type's unit
  std::optional<double> target_downsample_size;  ///< in resolution_type's unit
  bool crop = false;
  CropStyle crop_style = CropStyle::random;
  CropAspect crop_aspect = CropAspect::square;
  /// The aspect ratios crop_aspect "closest" chooses from (SimpleTuner's crop_aspect_buckets, as
  /// plain numbers; the weighted form belongs to crop_aspect "random", which remat does not do).
  std::vector<double> crop_aspect_buckets;
  /// Extra passes over this dataset per epoch (0: seen once per epoch), as SimpleTuner; at most
  /// kMaxRepeats.
  int64_t repeats = 0;
  /// Relative chance that a batch is drawn from this dataset, as SimpleTuner.
  double probability = 1.0;
  /// Where this dataset's VAE latents are cached (resolved to an absolute or run-relative path).
  std::string cache_dir_vae;
  /// Chance that a sample trains with the empty caption (SimpleTuner's per-backend value, else
  /// the global --caption_dropout_probability).
  double caption_dropout_probability = 0;
  /// The text_embeds backend whose cache holds this dataset's captions (its id).
  std::string text_embeds;
  /// FLUX.1 Kontext pairs (SimpleTuner's `conditioning_data`, a string or a list of ids): the
  /// conditioning dataset holding this dataset's reference pictures. remat pairs an image dataset
  /// with one conditioning dataset; empty when the dataset has none.
  std::vector<std::string> conditioning_data;
  /// Set on conditioning datasets only (SimpleTuner's `conditioning_type`): how a reference is
  /// cropped. reference_strict: exactly as its edit picture (the edit's resize
  /// and crop box); reference_loose: bucketed and cropped on its own, by its dataset's settings.
  std::optional<std::string> conditioning_type;
};

/// The values of `conditioning_type` remat trains (FLUX.1 Kontext's references).
inline constexpr const char* kReferenceStrict = "reference_strict";
inline constexpr const char* kReferenceLoose = "reference_loose";

/// One `"dataset_type": "text_embeds"` backend.
struct TextEmbedsConfig {
  std::string id;
  std::string cache_dir;
  bool is_default = false;
};

/// The datasets of one run: enabled image backends, text-embed backends, and the one warning
/// that lists the keys remat does not implement (empty when there are none).
struct DataBackendConfig {
  std::vector<ImageDatasetConfig> images;
  /// `"dataset_type": "conditioning"` backends (or any with a conditioning_type, as SimpleTuner
  /// reads them): reference pictures, paired with the images of the datasets that name them in
  /// conditioning_data (or that their `source_dataset_id` names) by relative path.
  std::vector<ImageDatasetConfig> conditioning;
  std::vector<TextEmbedsConfig> text_embeds;
  std::vector<std::string> warnings;
  /// The text_embeds backend `id` (throws c10::ValueError naming it when absent).
  const TextEmbedsConfig& text_embeds_of(const std::string& id) const;
  /// The conditioning dataset `image` is paired with, or nullptr when it has none.
  const ImageDatasetConfig* conditioning_of(const ImageDatasetConfig& image) const;
};

/// The global options that act as defaults for every backend, and where caches go by default
/// (SimpleTuner's layout: cache_dir_vae defaults to CACHE_DIR/vae/<model_family>/<id>, a text
/// cache to CACHE_DIR/text/<model_family>; SimpleTuner's --cache_dir defaults to OUTPUT_DIR/cache).
struct DataDefaults {
  std::string cache_dir = "cache";
  /// The run's model_family: names the default cache subfolders, as SimpleTuner's (latents of one
  /// family are not another's). Required where a default cache folder is made.
  std::string model_family;
  /// model_family, or a c10::ValueError when it is unset.
  const std::string& family_folder() const;
  double resolution = 1024;
  ResolutionType resolution_type = ResolutionType::pixel_area;
  std::optional<double> minimum_image_size;
  std::optional<double> maximum_image_size;
  std::optional<double> target_downsample_size;
  bool crop = false;
  CropStyle crop_style = CropStyle::random;
  CropAspect crop_aspect = CropAspect::square;
  CaptionStrategy caption_strategy = CaptionStrategy::filename;
  std::optional<std::string> instance_prompt;
  double caption_dropout_probability = 0;
};

/// Reads a multidatabackend.json. Throws c10::ValueError naming the file, the backend id, the key,
/// the value and what is supported for: unsupported backend types (aws, huggingface, csv, ...),
/// unsupported dataset_type values, bad values, duplicate ids, no enabled image backend, a
/// text_embeds reference to a missing id, no default text_embeds backend when one is needed
/// (SimpleTuner's rules); for conditioning datasets: a conditioning_type other than
/// reference_strict / reference_loose, a caption_strategy (references train with their edit's
/// caption), conditioning_data naming no conditioning dataset or more than one, a
/// reference_strict dataset paired with two image datasets (its crops would differ). Relative paths are taken as they are (relative to the working directory,
/// as SimpleTuner does).
REMAT_API DataBackendConfig read_data_backend_config(const std::string& path, const DataDefaults& defaults);

/// The one-folder configuration `--instance_data_dir DIR` stands for: one local image backend
/// with id "instance_data_dir" and the global defaults, and a default text_embeds backend.
REMAT_API DataBackendConfig single_folder_config(const std::string& instance_data_dir,
                                                 const DataDefaults& defaults);

/// Names for messages and metadata ("pixel_area", "center", ...).
REMAT_API const char* to_string(ResolutionType value);
REMAT_API const char* to_string(CaptionStrategy value);
REMAT_API const char* to_string(CropStyle value);
REMAT_API const char* to_string(CropAspect value);

}  // namespace remat::data
