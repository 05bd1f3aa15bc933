#include "profile_memory.h"

#include <algorithm>

#include "remat/compat.h"
#include "remat/memory.h"
#include "remat/train/memory/admission.h"
#include "remat/train/family/family.h"
#include "remat/ui/server.h"

namespace remat::ui::detail {

std::optional<ProfileDemand> profile_demand_lower_bound(const PlanShape& shape) {
  // Weights only: the profile leaves gradients unset until the backward and allocates no
  // optimizer state (remat::train::profile_step).
  train::ModelUse weights_only = shape.use;
  weights_only.training = false;
  const std::optional<train::MemoryDemand> model = train::predict_model_memory(shape.spec, weights_only);
  if (!model) return std::nullopt;
  ProfileDemand demand;
  demand.weight_bytes = shape.bf16 ? model->weight_bytes / 2 : model->weight_bytes;
  const train::ModelFamily& family = train::model_family(shape.spec.family);
  if (!compat::kHasScaledDotProductAttention && family.attention_layers) {
    const train::AttentionLayers attention = family.attention_layers(shape.spec);
    demand.attention = attention;
    demand.tokens = shape.image_tokens + shape.text_tokens;
    const double tokens = static_cast<double>(demand.tokens);
    // In doubles: the product overflows int64 for absurd shapes, which must still be refused.
    const double bytes = static_cast<double>(attention.count) * static_cast<double>(shape.batch) *
                         static_cast<double>(attention.heads) * tokens * tokens * 4.0;
    demand.attention_score_bytes = static_cast<int64_t>(std::min(bytes, 9e18));
  }
  return demand;
}

int64_t profile_memory_limit(int64_t configured) {
  if (configured > 0) return configured;
  const c10::Device cpu(c10::kCPU);
  // available_bytes counts this process's tracked tensors as available too; the child starts empty.
  const int64_t available = memory::available_bytes(cpu) - memory::current_bytes(cpu);
  if (available <= 0) return kDefaultProfileMemoryCap;  // no /proc/meminfo: the cap alone
  return std::min(kDefaultProfileMemoryCap, available / 2);
}

}  // namespace remat::ui::detail
