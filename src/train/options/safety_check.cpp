// The gradient-checkpointing safety check, after SimpleTuner's
// helpers/training/default_settings/safety_check.py (interval and segment-stride rules) and the
// backend rules of its Flux/MageFlow transformers (FluxTransformer2DModel.forward in
// simpletuner/helpers/models/flux/transformer.py, MageFlowTransformer2DModel.forward in
// simpletuner/helpers/models/mageflow/transformer.py). Rule numbers refer to the list in
// safety_check.h.
#include "remat/train/options/safety_check.h"
#include "remat/models/config_limits.h"

#include <algorithm>

#include "remat/train/family/family.h"
#include "remat/train/options/options.h"

namespace remat::train {
namespace {

const CheckpointingCapabilities* lookup(const CheckpointingSupport& families, const std::string& family) {
  for (const auto& [name, capabilities] : families) {
    if (name == family) return &capabilities;
  }
  return nullptr;
}

std::string families_with(const CheckpointingSupport& families, bool CheckpointingCapabilities::*feature) {
  std::string out;
  for (const auto& [name, capabilities] : families) {
    if (capabilities.*feature) out += (out.empty() ? "" : ", ") + name;
  }
  return out.empty() ? "none" : out;
}

// Whether the plan uses a (set, in range) segment stride, and why not (rule 4).
enum class StrideUse { Used, Unsupported, Auto, NoChunks };

StrideUse stride_use(const TrainConfig& config, const CheckpointingCapabilities& family) {
  const CheckpointInterval interval = interval_in_effect(config, family);
  if (!family.segment_stride) return StrideUse::Unsupported;
  if (interval.is_auto()) return StrideUse::Auto;
  if (!interval.chunk()) return StrideUse::NoChunks;
  return StrideUse::Used;
}

bool stride_in_range(int64_t stride) { return stride >= 1 && stride <= models::kMaxConfigBlocks; }

}  // namespace

CheckpointingSupport checkpointing_support() {
  CheckpointingSupport table;
  for (const ModelFamily* f : model_families()) table.emplace_back(f->name, f->checkpointing);
  return table;
}

CheckpointingCapabilities checkpointing_capabilities(const std::string& name) {
  const ModelFamily* family = find_model_family(name);
  return family ? family->checkpointing : CheckpointingCapabilities{};
}

CheckpointInterval interval_in_effect(const TrainConfig& config, const CheckpointingCapabilities& family) {
  // 3. Families without chunked checkpointing checkpoint per block.
  return family.interval ? config.gradient_checkpointing_interval : CheckpointInterval{};
}

CheckpointPlan checkpoint_plan_for(const TrainConfig& config, const CheckpointingCapabilities& family) {
  const auto& stride = config.gradient_checkpointing_segment_stride;
  // 4. The stride spaces fixed chunks only.
  const bool use_stride = stride && stride_in_range(*stride) && stride_use(config, family) == StrideUse::Used;
  return CheckpointPlan::simpletuner(config.gradient_checkpointing, interval_in_effect(config, family).chunk(),
                                     use_stride ? stride : std::nullopt, config.gradient_checkpointing_backend);
}

std::vector<std::string> safety_check(const TrainConfig& config, const CheckpointingSupport& families) {
  std::vector<std::string> messages;
  for (const auto& d : safety_check_diagnostics(config, families)) messages.push_back(d.message);
  return messages;
}

std::vector<Diagnostic> safety_check_diagnostics(const TrainConfig& config, const CheckpointingSupport& families) {
  // Each warning names its option, so a UI shows it next to that field.
  std::vector<Diagnostic> warnings;
  const auto warn = [&warnings](const std::string& option, const std::string& message) {
    warnings.push_back({Diagnostic::Severity::Warning, option, "", message});
  };
  const CheckpointingCapabilities none;
  const CheckpointingCapabilities* found = lookup(families, config.model_family);
  const CheckpointingCapabilities& family = found ? *found : none;
  const CheckpointInterval& interval = config.gradient_checkpointing_interval;
  const auto& stride = config.gradient_checkpointing_segment_stride;
  // The options as the plan uses them (rules 3 and 4 leave out what they warn about), for the
  // registry's dependency and relation rules below.
  TrainConfig in_effect = config;
  in_effect.gradient_checkpointing_interval = interval_in_effect(config, family);

  // Every error is collected and thrown together at the end.
  std::vector<Diagnostic> errors;
  const auto error = [&](const std::string& option, const std::string& value, const std::string& message) {
    errors.push_back({Diagnostic::Severity::Error, option, value, message});
  };

  // 2. The interval is valid by construction (CheckpointInterval: the registry's bounds).

  // 3. Families without chunked checkpointing ignore the interval.
  if (!interval.per_block() && !family.interval) {
    warn("gradient_checkpointing_interval", "[train] gradient_checkpointing_interval is not supported with " + config.model_family +
                       " models and is ignored (supported: " +
                       families_with(families, &CheckpointingCapabilities::interval) + ")");
  }

  // 4. Stride. At most models::kMaxConfigBlocks, the registry's bound (Note [Option bounds]), for
  //    configs built in code.
  if (stride) {
    const std::string value = std::to_string(*stride);
    const std::string blocks = std::to_string(models::kMaxConfigBlocks);
    const StrideUse use = stride_in_range(*stride) ? stride_use(config, family) : StrideUse::Used;
    if (!stride_in_range(*stride)) {
      error("gradient_checkpointing_segment_stride", value,
            "[train] gradient_checkpointing_segment_stride must be an integer in [1, " + blocks + "], got " + value);
    } else if (use == StrideUse::Unsupported) {
      warn("gradient_checkpointing_segment_stride", "[train] gradient_checkpointing_segment_stride is not supported with " +
                         config.model_family + " models and is ignored (supported: " +
                         families_with(families, &CheckpointingCapabilities::segment_stride) + ")");
    } else if (use == StrideUse::Auto) {
      warn("gradient_checkpointing_segment_stride", "[train] gradient_checkpointing_segment_stride=" + value +
                         " is ignored with gradient_checkpointing_interval=auto (the planner picks the stride)");
    } else if (use == StrideUse::NoChunks) {
      warn("gradient_checkpointing_segment_stride", "[train] gradient_checkpointing_segment_stride=" + value +
                         " requires gradient_checkpointing_interval greater than 1; ignoring segment stride");
    } else {
      // stride >= interval: the registry's relation.
      for (auto& d : relation_diagnostics(in_effect, "gradient_checkpointing_segment_stride")) {
        errors.push_back(std::move(d));
      }
    }
    if (use != StrideUse::Used) in_effect.gradient_checkpointing_segment_stride.reset();
  }

  // 5. The -ffn scope needs a block split at its feed-forward half.
  if (config.checkpoint_ffn_only() && !family.ffn_scope) {
    error("gradient_checkpointing_backend", config.gradient_checkpointing_backend,
          "[train] gradient_checkpointing_backend must be torch or unsloth for " + config.model_family +
              " models (the -ffn scope is supported by: " +
              families_with(families, &CheckpointingCapabilities::ffn_scope) + "), got " +
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
  // checkpointing off they do nothing; a budget without interval auto is ignored (the trainer
  // reads it only for auto). dependency_diagnostics resets what it ignores: in the copy only.
  for (auto& d : dependency_diagnostics(in_effect, /*checkpointing=*/true)) warnings.push_back(std::move(d));

  if (!errors.empty()) throw ValidationErrors(std::move(errors));
  return warnings;
}

}  // namespace remat::train
