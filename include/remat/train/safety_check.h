#pragma once
/// \file
/// The gradient-checkpointing safety check of `remat train`, after SimpleTuner's
/// `safety_check.py`: it normalises the checkpointing options of a TrainConfig, drops what a model
/// family cannot use (with a warning) and refuses what cannot work (ValidationError).
///
/// Which family supports what comes from the family registry, checkpointing_support(); the check
/// takes the table as a parameter so tests can exercise a family without a feature.

#include <string>
#include <vector>

#include "remat/export.h"
#include "remat/train/config.h"

namespace remat::train {

/// What a model family's transformer supports for gradient checkpointing.
struct FamilyCheckpointing {
  std::string family;           ///< model_family value
  bool interval = false;        ///< contiguous chunks of N blocks (gradient_checkpointing_interval)
  bool segment_stride = false;  ///< chunks starting every S blocks (..._segment_stride)
  bool ffn_scope = false;       ///< "-ffn" backends: checkpoint only the feed-forward half
};

/// The registered families' capabilities (ModelFamily::checkpointing, remat/train/family.h).
REMAT_API std::vector<FamilyCheckpointing> checkpointing_support();

/// Checks and normalises the checkpointing options of `config` in place; returns the warnings
/// (the caller logs them). Rules, in order:
///  1. gradient_checkpointing false: interval, stride, a non-default backend or a memory budget
///     have no effect (one warning each); the values are kept but unused.
///  2. interval 0 or negative: error. Interval 1 means per-block and is stored as unset.
///  3. interval (or "auto") on a family without interval support: warning, dropped.
///  4. stride 0 or negative: error; on a family without stride support: warning, dropped; without
///     an interval: warning, ignored (dropped); with "auto": warning, dropped (the planner picks
///     it); below the interval: error.
///  5. a "-ffn" backend on a family without an ffn scope: error.
///  6. "unsloth"/"unsloth-ffn" on device cpu: warning that CPU tensors stay in place (the offload
///     backend only moves CUDA tensors to pinned host memory).
///  7. a memory budget without interval "auto" (checkpointing on): warning, dropped.
/// Rules 1 and 7 are the registry's dependency rule (dependency_diagnostics), the stride's lower
/// bound its relation to the interval (relation_diagnostics). A family missing from `families`
/// supports nothing. Throws ValidationErrors with every error, each naming the option, the value
/// and what is valid.
REMAT_API std::vector<std::string> safety_check(
    TrainConfig& config,
    const std::vector<FamilyCheckpointing>& families = checkpointing_support());

/// safety_check with each warning as a Diagnostic naming its option (what validate_option_values
/// reports, so a UI can show each warning next to its field). Throws as safety_check does.
REMAT_API std::vector<Diagnostic> safety_check_diagnostics(
    TrainConfig& config,
    const std::vector<FamilyCheckpointing>& families = checkpointing_support());

}  // namespace remat::train
