#pragma once
/// \file
/// The bridge between `remat train`'s options and the data layer: the global data options of a
/// TrainConfig as the defaults of every image backend.

#include "remat/data/dataset_config.h"
#include "remat/export.h"
#include "remat/train/options/config.h"

namespace remat::train {

/// config's resolution, resolution_type, minimum/maximum_image_size, target_downsample_size, crop,
/// crop_style, crop_aspect, caption_strategy, instance_prompt, caption_dropout_probability and
/// cache_dir as data::DataDefaults (values were validated with the options).
REMAT_API data::DataDefaults data_defaults(const TrainConfig& config);

}  // namespace remat::train
