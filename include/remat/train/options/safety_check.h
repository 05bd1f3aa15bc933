#pragma once
/// \file
/// The gradient-checkpointing safety check of `remat train`, after SimpleTuner's
/// `safety_check.py`: it reports what a model family cannot use of the checkpointing options of a
/// TrainConfig (warnings) and refuses what cannot work (ValidationErrors). It changes nothing:
/// the plan leaves out what the warnings say is ignored (checkpoint_plan_for), from the same rules.
///
/// Which family supports what comes from the family registry, checkpointing_support(); the check
/// takes the table as a parameter so tests can exercise a family without a feature.

#include <string>
#include <utility>
#include <vector>

#include "remat/export.h"
#include "remat/train/options/config.h"
#include "remat/train/family/family.h"

namespace remat::train {

/// Each registered family's checkpointing capabilities (ModelFamily::checkpointing), by
/// model_family value, in registration order.
using CheckpointingSupport = std::vector<std::pair<std::string, CheckpointingCapabilities>>;

/// The registered families' capabilities.
REMAT_API CheckpointingSupport checkpointing_support();

/// Checks the checkpointing options of `config`; returns the warnings (the caller logs them) and
/// changes nothing. Rules, in order:
///  1. gradient_checkpointing false: interval, stride, a non-default backend or a memory budget
///     have no effect (one warning each); the values are kept but unused.
///  2. The interval needs no check: CheckpointInterval holds only what the options registry
///     accepts (1 is per block, as blank).
///  3. interval N > 1 (or "auto") on a family without interval support: warning, ignored.
///  4. stride 0 or negative: error; on a family without stride support: warning, ignored; without
///     an interval > 1: warning, ignored; with "auto": warning, ignored (the planner picks it);
///     below the interval: error.
///  5. a "-ffn" backend on a family without an ffn scope: error.
///  6. "unsloth"/"unsloth-ffn" on device cpu: warning that CPU tensors stay in place (the offload
///     backend only moves CUDA tensors to pinned host memory).
///  7. a memory budget without interval "auto" (checkpointing on): warning, ignored.
/// Rules 1 and 7 are the registry's dependency rule (dependency_diagnostics), the stride's lower
/// bound its relation to the interval (relation_diagnostics); they see the options as the plan
/// uses them (an interval or stride ignored by rule 3 or 4 draws no second warning). A family
/// missing from `families` supports nothing. Throws ValidationErrors with every error, each
/// naming the option, the value and what is valid.
REMAT_API std::vector<std::string> safety_check(const TrainConfig& config,
                                                const CheckpointingSupport& families = checkpointing_support());

/// safety_check with each warning as a Diagnostic naming its option (what validate_option_values
/// reports, so a UI can show each warning next to its field). Throws as safety_check does.
REMAT_API std::vector<Diagnostic> safety_check_diagnostics(
    const TrainConfig& config, const CheckpointingSupport& families = checkpointing_support());

/// The checkpoint plan of `config`'s options on a family with `family`'s capabilities: an interval
/// the family cannot chunk is per block, a stride the family cannot use, or with no fixed chunks
/// longer than one block to space (per block, auto), is unset (rules 3 and 4). `auto` is per block
/// until the budget planner replaces the plan. Throws c10::ValueError for a stride below the
/// interval (the safety check's error).
REMAT_API CheckpointPlan checkpoint_plan_for(const TrainConfig& config, const CheckpointingCapabilities& family);

/// The interval `config`'s plan uses on a family with `family`'s capabilities (per block where the
/// family has no chunks, rule 3).
REMAT_API CheckpointInterval interval_in_effect(const TrainConfig& config, const CheckpointingCapabilities& family);

/// The capabilities of the registered family `name`; none (all false) when it is not registered.
REMAT_API CheckpointingCapabilities checkpointing_capabilities(const std::string& name);

}  // namespace remat::train
