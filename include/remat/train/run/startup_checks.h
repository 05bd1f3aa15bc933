#pragma once
/// \file
/// Checks a run makes before it loads a model or data, so that a bad path is a named error
/// (exit 2) in the first second instead of a raw `filesystem error` after minutes of loading,
/// and so that nothing is written before everything has been checked.

#include <string>

#include "remat/export.h"
#include "remat/train/data/data.h"
#include "remat/train/family/family.h"

namespace remat::train {

/// output_dir must be a directory this process can create files in: created (with its parents)
/// when missing; refused when it is a file, under a file, a symlink loop or not writable (a
/// probe file is created and removed). Throws ValidationError (option output_dir) saying which.
REMAT_API void check_output_dir(const std::string& dir);

/// instance_data_dir must be a readable directory (not a file, not a symlink loop). Throws
/// ValidationError (option instance_data_dir).
REMAT_API void check_data_dir(const std::string& dir);

/// The dataset's widths must be the model's: prompt_embeds width D, pooled width P and latent
/// channels C as `model` (ModelFamily::conditioning of the run's spec) reads them, checked on
/// the headers before training writes anything. Throws ValidationError (option
/// instance_data_dir) naming both figures and the model's field.
REMAT_API void check_dataset_fits_model(const LatentDataset& dataset, const ConditioningWidths& model,
                                        const std::string& model_name);

/// check_dataset_fits_model for the cached samples of an image run (option data_backend_config
/// or instance_data_dir): the widths of the model's encoders must be the transformer's.
REMAT_API void check_cached_images_fit_model(const MultiDataset& dataset, const ConditioningWidths& model,
                                             const std::string& model_name);

/// A file an option will write at the end of a run (`remat bench --json PATH`): its directory
/// must exist and accept new files (probed), and the path must not be a directory. Throws
/// ValidationError naming `option`.
REMAT_API void check_output_file(const std::string& path, const std::string& option);

}  // namespace remat::train
