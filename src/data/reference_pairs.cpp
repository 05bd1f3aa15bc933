// FLUX.1 Kontext's picture pairs: every edit picture of an image dataset with its reference picture
// from the conditioning dataset, matched by relative path as SimpleTuner matches them
// (simpletuner/helpers/training/validation.py retrieve_validation_edit_images and the sampler's
// get_conditioning_sample: the edit's path relative to its folder, looked up in the conditioning
// dataset), cropped as simpletuner/helpers/data_backend/factory.py configure_data_backend does:
// reference_strict copies the edit's crop metadata (DatasetDuplicator.copy_metadata),
// reference_loose buckets the reference on its own.
#include <map>

#include "remat/data/image_dataset.h"

namespace remat::data {

void pair_references(ScannedDataset& edits, const ImageDatasetConfig& conditioning, uint64_t seed,
                     int64_t pixel_multiple) {
  const bool strict = conditioning.conditioning_type.value_or(kReferenceStrict) == kReferenceStrict;
  ImageDatasetConfig scan_config = conditioning;
  // A strict reference takes its edit's crop, so its own size limits do not apply.
  if (strict) scan_config.minimum_image_size.reset();
  const ScannedDataset scanned = scan_image_dataset(scan_config, seed, pixel_multiple);
  std::map<std::string, const ImageRecord*> by_path;
  for (const auto& record : scanned.images) by_path.emplace(record.relative_path, &record);
  std::map<std::string, std::string> unusable;  // relative path -> why the scan skipped it
  for (const auto& problem : scanned.skipped) {
    const std::string prefix = conditioning.instance_data_dir + "/";
    const std::string relative =
        problem.path.rfind(prefix, 0) == 0 ? problem.path.substr(prefix.size()) : problem.path;
    unusable.emplace(relative, problem.reason);
  }

  ReferenceSet references{conditioning, {}};
  std::vector<ImageRecord> kept;
  size_t used = 0;
  for (auto& edit : edits.images) {
    const auto found = by_path.find(edit.relative_path);
    if (found == by_path.end()) {
      const auto why = unusable.find(edit.relative_path);
      const std::string where = conditioning.instance_data_dir + "/" + edit.relative_path;
      edits.skipped.push_back(
          {edit.path, why == unusable.end()
                          ? "no reference picture: conditioning dataset '" + conditioning.id + "' has no " + where
                          : "reference picture unusable: " + where + ": " + why->second});
      continue;
    }
    ImageRecord reference = *found->second;
    reference.caption.clear();  // references train with their edit's caption
    if (strict) {
      reference.crop = edit.crop;  // resized to the edit's resized size, then the same box
    }
    references.images.push_back(std::move(reference));
    kept.push_back(std::move(edit));
    ++used;
  }
  edits.images = std::move(kept);
  if (used < scanned.images.size()) {
    edits.warnings.push_back({conditioning.instance_data_dir,
                              std::to_string(scanned.images.size() - used) + " reference picture(s) of '" +
                                  conditioning.id + "' have no edit picture in '" + edits.config.id +
                                  "' and are not used"});
  }
  edits.references = std::move(references);
}

}  // namespace remat::data
