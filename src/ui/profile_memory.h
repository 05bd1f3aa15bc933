#pragma once
// How much memory a step profile behind POST /api/plan may use, and the least it will need:
// a profile predicted not to fit is refused before it starts, and the child process that runs
// the others is killed when its resident memory goes beyond the limit (plan_figures.cpp).

#include <cstdint>
#include <optional>

#include "plan_shape.h"
#include "remat/train/family/family.h"

namespace remat::ui::detail {

/// The least a step profile of a shape holds at the end of its forward pass.
struct ProfileDemand {
  /// The model's weights at the precision profiled (remat::train::predict_model_memory).
  int64_t weight_bytes = 0;
  /// Where attention materialises its score matrices (LibTorch 1.13: remat/compat.h's formula),
  /// the float32 softmax every attention layer keeps for its backward: layers x batch x heads x
  /// tokens^2 x 4 bytes (ModelFamily::attention_layers). 0 with a fused attention kernel, or
  /// when the family does not say.
  int64_t attention_score_bytes = 0;
  train::AttentionLayers attention;  ///< the layers counted (count 0: none)
  int64_t tokens = 0;                ///< image + text tokens of a sample
  int64_t total() const { return weight_bytes + attention_score_bytes; }
};

/// nullopt when the family predicts no model memory (then nothing is refused up front).
std::optional<ProfileDemand> profile_demand_lower_bound(const PlanShape& shape);

/// The memory one step profile may use: `configured` when > 0; otherwise half of what the
/// machine has available now (MemAvailable), at most remat::ui::kDefaultProfileMemoryCap.
int64_t profile_memory_limit(int64_t configured);

}  // namespace remat::ui::detail
