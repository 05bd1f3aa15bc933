#pragma once
/// \file
/// Saved-input policies: where a checkpoint keeps its segment inputs between the forward pass and
/// recomputation, and what that costs. SimpleTuner calls them gradient-checkpointing backends:
/// "torch" keeps them on the device, "unsloth" offloads them to pinned host memory. Each policy is
/// a named object that runs as one remat::Backend mechanism and reports its memory and transfer
/// costs to the planner (remat/plan.h), which charges them per checkpointed segment. The names are
/// parsed here and nowhere else.

#include <cstdint>
#include <string>
#include <vector>

#include "remat/checkpoint.h"
#include "remat/export.h"

namespace remat {

class REMAT_API SavedInputPolicy {
 public:
  virtual ~SavedInputPolicy() = default;
  /// The option value that selects it: "torch", "unsloth".
  virtual std::string name() const = 0;
  /// A short description for help texts and plans.
  virtual std::string description() const = 0;
  /// The mechanism remat::checkpoint runs for it.
  virtual Backend backend() const = 0;
  /// Device bytes a checkpoint holds until backward for segment inputs of `input_bytes`;
  /// `accelerator`: the inputs live on a GPU (false: CPU, where nothing can move to the host).
  virtual int64_t device_bytes_held(int64_t input_bytes, bool accelerator) const = 0;
  /// Bytes copied between device and host for one checkpoint in one training step (each
  /// direction counted once: out after forward, back before recomputation).
  virtual int64_t bytes_moved(int64_t input_bytes, bool accelerator) const = 0;
};

/// The policy of a mechanism (the built-in policies are one per Backend).
REMAT_API const SavedInputPolicy& saved_input_policy(Backend backend);
/// The policy named `name`; throws c10::ValueError naming the value and the valid names.
REMAT_API const SavedInputPolicy& saved_input_policy(const std::string& name);
/// Every policy name, in a stable order: "torch", "unsloth".
REMAT_API std::vector<std::string> saved_input_policy_names();

}  // namespace remat
