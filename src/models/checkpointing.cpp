#include "remat/models/checkpointing.h"

#include <algorithm>
#include <stdexcept>

namespace remat::models {

const std::vector<std::string>& GradientCheckpointing::backend_names() {
  static const std::vector<std::string> names = {"torch", "unsloth", "torch-ffn", "unsloth-ffn"};
  return names;
}

void GradientCheckpointing::set_interval(std::optional<int64_t> interval) {
  if (interval.has_value() && *interval < 1) {
    throw std::invalid_argument("[gradient_checkpointing] interval must be >= 1 (or unset), got " +
                                std::to_string(*interval));
  }
  interval_ = interval;
}

void GradientCheckpointing::set_backend(const std::string& name) {
  const auto& names = backend_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string valid;
    for (const auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
    throw std::invalid_argument("[gradient_checkpointing] backend must be one of " + valid +
                                ", got '" + name + "'");
  }
  backend_ = name;
}

void GradientCheckpointing::set_segment_stride(std::optional<int64_t> stride) {
  if (stride.has_value() && *stride < 1) {
    throw std::invalid_argument(
        "[gradient_checkpointing] segment_stride must be >= 1 (or unset), got " +
        std::to_string(*stride));
  }
  segment_stride_ = stride;
}

bool GradientCheckpointing::ffn_scope() const {
  if (has_layouts()) return false;
  return backend_.size() > 4 && backend_.compare(backend_.size() - 4, 4, "-ffn") == 0;
}

Backend GradientCheckpointing::base_backend() const {
  return backend_.rfind("unsloth", 0) == 0 ? Backend::Offload : Backend::Recompute;
}

Layout GradientCheckpointing::layout_for(size_t stack, int64_t num_blocks) const {
  if (has_layouts()) {
    if (stack >= layouts_.size()) {
      throw std::invalid_argument("[gradient_checkpointing] no explicit layout for block stack " +
                                  std::to_string(stack) + " (" + std::to_string(layouts_.size()) +
                                  " given)");
    }
    const Layout& layout = layouts_[stack];
    if (layout.num_blocks() != num_blocks) {
      throw std::invalid_argument("[gradient_checkpointing] layout of block stack " +
                                  std::to_string(stack) + " must cover " +
                                  std::to_string(num_blocks) + " blocks, got " +
                                  std::to_string(layout.num_blocks()));
    }
    validate_layout(layout, num_blocks);
    return layout;
  }
  const int64_t interval = interval_.value_or(1);
  // SimpleTuner's segmented path (the only one using the stride) needs interval > 1.
  const std::optional<int64_t> stride = interval > 1 ? segment_stride_ : std::nullopt;
  return layout_from_interval(num_blocks, interval, stride, base_backend());
}

Tensors run_block_part(const SegmentFn& part, const Tensors& inputs, std::optional<Backend> backend) {
  if (!backend) return part(inputs);
  CheckpointOptions options;
  options.backend = *backend;
  return remat::checkpoint(part, inputs, options);
}

}  // namespace remat::models
