// TEMPORARY (branch cache): data_defaults until the dsc branch's implementation is merged; delete
// this file then (a duplicate definition will fail the link and say so).
#include "remat/train/data_options.h"

namespace remat::train {

data::DataDefaults data_defaults(const TrainConfig& config) {
  data::DataDefaults d;
  d.cache_dir = config.cache_dir;
  d.resolution = config.resolution;
  d.resolution_type = config.resolution_type == "pixel" ? data::ResolutionType::pixel
                      : config.resolution_type == "area" ? data::ResolutionType::area
                                                         : data::ResolutionType::pixel_area;
  d.minimum_image_size = config.minimum_image_size;
  d.maximum_image_size = config.maximum_image_size;
  d.target_downsample_size = config.target_downsample_size;
  d.crop = config.crop;
  d.crop_style = config.crop_style == "center" ? data::CropStyle::center
                 : config.crop_style == "corner" ? data::CropStyle::corner
                                                 : data::CropStyle::random;
  d.crop_aspect = config.crop_aspect == "preserve" ? data::CropAspect::preserve
                  : config.crop_aspect == "closest" ? data::CropAspect::closest
                                                    : data::CropAspect::square;
  d.caption_strategy = config.caption_strategy == "textfile" ? data::CaptionStrategy::textfile
                       : config.caption_strategy == "instanceprompt" ? data::CaptionStrategy::instanceprompt
                                                                     : data::CaptionStrategy::filename;
  d.instance_prompt = config.instance_prompt;
  d.caption_dropout_probability = config.caption_dropout_probability;
  return d;
}

}  // namespace remat::train
