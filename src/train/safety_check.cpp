// The gradient-checkpointing safety check, after SimpleTuner's
// helpers/training/default_settings/safety_check.py (interval and segment-stride rules) and the
// backend rules of its Flux/MageFlow transformers (FluxTransformer2DModel.forward in
// simpletuner/helpers/models/flux/transformer.py, MageFlowTransformer2DModel.forward in
// simpletuner/helpers/models/mageflow/transformer.py). Rule numbers refer to the list in
// safety_check.h.
#include "remat/train/safety_check.h"
#include "remat/models/config_limits.h"

#include <algorithm>

#include "remat/train/family.h"
#include "remat/train/options.h"

namespace remat::train {
namespace {

const FamilyCheckpointing* lookup(const std::vector<FamilyCheckpointing>& families, const std::string& family) {
  for (const auto& f : families) {
    if (f.family == family) return &f;
  }
  return nullptr;
}

std::string families_with(const std::vector<FamilyCheckpointing>& families,
                          bool FamilyCheckpointing::*feature) {
  std::string out;
  for (const auto& f : families) {
    if (f.*feature) out += (out.empty() ? "" : ", ") + f.family;
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::vector<FamilyCheckpointing> checkpointing_support() {
  std::vector<FamilyCheckpointing> table;
  for (const ModelFamily* f : model_families()) {
    table.push_back({f->name, f->checkpointing.interval, f->checkpointing.segment_stride,
                     f->checkpointing.ffn_scope});
  }
  return table;
}

std::vector<std::string> safety_check(TrainConfig& config, const std::vector<FamilyCheckpointing>& families) {
  std::vector<std::string> messages;
  for (const auto& d : safety_check_diagnostics(config, families)) messages.push_back(d.message);
  return messages;
}

std::vector<Diagnostic> safety_check_diagnostics(TrainConfig& config, const std::vector<FamilyCheckpointing>& families) {
  // Each warning names its option, so a UI shows it next to that field.
  std::vector<Diagnostic> warnings;
  const auto warn = [&warnings](const std::string& option, const std::string& message) {
    warnings.push_back({Diagnostic::Severity::Warning, option, "", message});
  };
  const FamilyCheckpointing none{config.model_family};
  const FamilyCheckpointing* found = lookup(families, config.model_family);
  const FamilyCheckpointing& family = found ? *found : none;
  auto& interval = config.gradient_checkpointing_interval;
  auto& stride = config.gradient_checkpointing_segment_stride;

  // Every error is collected and thrown together at the end.
  std::vector<Diagnostic> errors;
  const auto error = [&](const std::string& option, const std::string& value, const std::string& message) {
    errors.push_back({Diagnostic::Severity::Error, option, value, message});
  };

  // 2. Interval: positive; 1 is per-block checkpointing, which is what "unset" means. At most
  //    models::kMaxConfigBlocks, the registry's bound (Note [Option bounds]), for configs built in code.
  const std::string blocks = std::to_string(models::kMaxConfigBlocks);
  if (interval && (*interval <= 0 || *interval > models::kMaxConfigBlocks)) {
    error("gradient_checkpointing_interval", std::to_string(*interval),
          "[train] gradient_checkpointing_interval must be an integer in [1, " + blocks + "] or auto (leave "
          "blank for per-block checkpointing), got " + std::to_string(*interval));
    interval.reset();
  }
  if (interval && *interval == 1) interval.reset();

  // 3. Families without chunked checkpointing drop the interval.
  if ((interval || config.gradient_checkpointing_interval_auto) && !family.interval) {
    warn("gradient_checkpointing_interval", "[train] gradient_checkpointing_interval is not supported with " + config.model_family +
                       " models and is ignored (supported: " +
                       families_with(families, &FamilyCheckpointing::interval) + ")");
    interval.reset();
    config.gradient_checkpointing_interval_auto = false;
  }

  // 4. Stride.
  if (stride) {
    const std::string value = std::to_string(*stride);
    if (*stride <= 0 || *stride > models::kMaxConfigBlocks) {
      error("gradient_checkpointing_segment_stride", value,
            "[train] gradient_checkpointing_segment_stride must be an integer in [1, " + blocks + "], got " + value);
    } else if (!family.segment_stride) {
      warn("gradient_checkpointing_segment_stride", "[train] gradient_checkpointing_segment_stride is not supported with " +
                         config.model_family + " models and is ignored (supported: " +
                         families_with(families, &FamilyCheckpointing::segment_stride) + ")");
      stride.reset();
    } else if (config.gradient_checkpointing_interval_auto) {
      warn("gradient_checkpointing_segment_stride", "[train] gradient_checkpointing_segment_stride=" + value +
                         " is ignored with gradient_checkpointing_interval=auto (the planner picks the stride)");
      stride.reset();
    } else if (!interval) {
      warn("gradient_checkpointing_segment_stride", "[train] gradient_checkpointing_segment_stride=" + value +
                         " requires gradient_checkpointing_interval greater than 1; ignoring segment stride");
      stride.reset();
    } else {
      // stride >= interval: the registry's relation.
      for (auto& d : relation_diagnostics(config, "gradient_checkpointing_segment_stride")) {
        errors.push_back(std::move(d));
      }
    }
  }

  // 5. The -ffn scope needs a block split at its feed-forward half.
  if (config.checkpoint_ffn_only() && !family.ffn_scope) {
    error("gradient_checkpointing_backend", config.gradient_checkpointing_backend,
          "[train] gradient_checkpointing_backend must be torch or unsloth for " + config.model_family +
              " models (the -ffn scope is supported by: " +
              families_with(families, &FamilyCheckpointing::ffn_scope) + "), got " +
              config.gradient_checkpointing_backend);
  }

  // 6. Offload moves CUDA tensors only (remat::Backend::Offload).
  if (config.gradient_checkpointing && config.checkpoint_backend() == Backend::Offload && config.device == "cpu") {
    warn("gradient_checkpointing_backend", "[train] gradient_checkpointing_backend=" + config.gradient_checkpointing_backend +
                       " offloads CUDA tensors to pinned host memory; on device cpu the saved tensors "
                       "stay in place (it behaves like " +
                       (config.checkpoint_ffn_only() ? std::string("torch-ffn") : std::string("torch")) + ")");
  }

  // 1 and 7. Options whose dependency does not hold (depends_on in the registry): with
  // checkpointing off they do nothing; a budget without interval auto is dropped.
  for (auto& d : dependency_diagnostics(config, /*checkpointing=*/true)) warnings.push_back(std::move(d));

  if (!errors.empty()) throw ValidationErrors(std::move(errors));
  return warnings;
}

}  // namespace remat::train
