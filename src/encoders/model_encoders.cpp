#include "remat/encoders/model_encoders.h"

namespace remat::encoders {

std::vector<std::string> FamilyEncoders::components(bool text, bool image) const {
  std::vector<std::string> names;
  if (text) names.insert(names.end(), text_components.begin(), text_components.end());
  if (image) names.insert(names.end(), image_components.begin(), image_components.end());
  return names;
}

PipelineFolder FamilyEncoders::open(const std::string& root, const std::vector<std::string>& required,
                                    const std::string& variant) const {
  return PipelineFolder::open(root, required, {}, layout, variant);
}

}  // namespace remat::encoders
