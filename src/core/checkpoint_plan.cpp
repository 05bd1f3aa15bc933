#include "remat/checkpoint_plan.h"

#include "remat/util/error.h"

#include <tuple>

namespace remat {
namespace {

const std::string kFfnSuffix = "-ffn";

bool ends_with_ffn(const std::string& name) {
  return name.size() > kFfnSuffix.size() &&
         name.compare(name.size() - kFfnSuffix.size(), kFfnSuffix.size(), kFfnSuffix) == 0;
}

}  // namespace

CheckpointPlan CheckpointPlan::off() { return CheckpointPlan{}; }

std::vector<std::string> CheckpointPlan::backend_names() {
  std::vector<std::string> names = saved_input_policy_names();
  const size_t n = names.size();
  for (size_t i = 0; i < n; ++i) names.push_back(names[i] + kFfnSuffix);
  return names;
}

CheckpointPlan CheckpointPlan::simpletuner(bool enabled, std::optional<int64_t> interval,
                                           std::optional<int64_t> segment_stride,
                                           const std::string& backend) {
  CheckpointPlan plan;
  plan.enabled = enabled;
  plan.interval = interval;
  plan.segment_stride = segment_stride;
  std::tie(plan.saved_inputs, plan.scope) = parse_backend_name(backend);
  plan.validate();
  return plan;
}

std::pair<const SavedInputPolicy*, CheckpointScope> CheckpointPlan::parse_backend_name(
    const std::string& backend) {
  const bool ffn = ends_with_ffn(backend);
  const std::string policy = ffn ? backend.substr(0, backend.size() - kFfnSuffix.size()) : backend;
  for (const auto& name : saved_input_policy_names()) {
    if (name == policy) {
      return {&saved_input_policy(policy), ffn ? CheckpointScope::FeedForward : CheckpointScope::Blocks};
    }
  }
  std::string valid;
  for (const auto& name : backend_names()) valid += (valid.empty() ? "" : ", ") + name;
  throw_value_error("[checkpointing] backend must be one of " + valid + ", got '" + backend + "'");
}

CheckpointPlan CheckpointPlan::from_layouts(std::vector<Layout> stack_layouts) {
  CheckpointPlan plan;
  plan.enabled = true;
  plan.stack_layouts = std::move(stack_layouts);
  return plan;
}

std::string CheckpointPlan::backend_name() const {
  return saved_inputs->name() + (scope == CheckpointScope::FeedForward ? kFfnSuffix : "");
}

void CheckpointPlan::validate() const {
  if (saved_inputs == nullptr) throw_value_error("[checkpointing] saved_inputs must be a policy, got null");
  if (interval && *interval < 1) {
    throw_value_error("[checkpointing] interval must be >= 1 (or unset), got " + std::to_string(*interval));
  }
  if (segment_stride && *segment_stride < 1) {
    throw_value_error("[checkpointing] segment_stride must be >= 1 (or unset), got " +
                      std::to_string(*segment_stride));
  }
  if (interval && *interval > 1 && segment_stride && *segment_stride < *interval) {
    throw_value_error("[checkpointing] segment_stride must be >= interval (" + std::to_string(*interval) +
                      "), got " + std::to_string(*segment_stride));
  }
}

Layout CheckpointPlan::layout_for(size_t stack, int64_t num_blocks) const {
  if (!stack_layouts.empty()) {
    if (stack >= stack_layouts.size()) {
      throw_value_error("[checkpointing] no explicit layout for block stack " + std::to_string(stack) +
                        " (" + std::to_string(stack_layouts.size()) + " given)");
    }
    const Layout& layout = stack_layouts[stack];
    if (layout.num_blocks() != num_blocks) {
      throw_value_error("[checkpointing] layout of block stack " + std::to_string(stack) +
                        " must cover " + std::to_string(num_blocks) + " blocks, got " +
                        std::to_string(layout.num_blocks()));
    }
    validate_layout(layout, num_blocks);
    return layout;
  }
  const int64_t chunk = interval.value_or(1);
  // SimpleTuner's segmented path (the only one using the stride) needs interval > 1.
  const std::optional<int64_t> stride = chunk > 1 ? segment_stride : std::nullopt;
  return layout_from_interval(num_blocks, chunk, stride, backend());
}

std::string CheckpointPlan::describe(const std::vector<std::string>& stack_names,
                                     const std::vector<int64_t>& stack_sizes) const {
  if (!enabled) return "off";
  if (ffn_scope()) {
    return "feed-forward parts (" + backend_name() + ")" +
           (interval ? ", blocks k with k % " + std::to_string(*interval) + " == 0" : "");
  }
  std::string out;
  for (size_t i = 0; i < stack_sizes.size(); ++i) {
    const std::string name = i < stack_names.size() ? stack_names[i] : "stack " + std::to_string(i);
    out += (i ? "; " : "") + name + " (" + std::to_string(stack_sizes[i]) + "): " +
           (stack_sizes[i] == 0 ? std::string("none") : describe_layout(layout_for(i, stack_sizes[i])));
  }
  return out;
}

}  // namespace remat
