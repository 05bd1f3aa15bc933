// The global data options of `remat train` as the defaults of every image backend. The option
// registry (options.cpp) has already checked each value against its choices and bounds.
#include "remat/train/options/data_options.h"

namespace remat::train {

data::DataDefaults data_defaults(const TrainConfig& config) {
  data::DataDefaults d;
  // SimpleTuner: an unset --cache_dir is OUTPUT_DIR/cache.
  d.cache_dir = config.cache_dir.empty() ? config.output_dir + "/cache" : config.cache_dir;
  d.model_family = config.model_family;
  d.resolution = config.resolution;
  d.resolution_type = config.resolution_type == "pixel"  ? data::ResolutionType::pixel
                      : config.resolution_type == "area" ? data::ResolutionType::area
                                                         : data::ResolutionType::pixel_area;
  d.minimum_image_size = config.minimum_image_size;
  d.maximum_image_size = config.maximum_image_size;
  d.target_downsample_size = config.target_downsample_size;
  d.crop = config.crop;
  d.crop_style = config.crop_style == "center"   ? data::CropStyle::center
                 : config.crop_style == "corner" ? data::CropStyle::corner
                                                 : data::CropStyle::random;
  d.crop_aspect = config.crop_aspect == "preserve"  ? data::CropAspect::preserve
                  : config.crop_aspect == "closest" ? data::CropAspect::closest
                                                    : data::CropAspect::square;
  d.caption_strategy = config.caption_strategy == "textfile"         ? data::CaptionStrategy::textfile
                       : config.caption_strategy == "instanceprompt" ? data::CaptionStrategy::instanceprompt
                                                                     : data::CaptionStrategy::filename;
  d.instance_prompt = config.instance_prompt;
  d.caption_dropout_probability = config.caption_dropout_probability;
  return d;
}

}  // namespace remat::train
