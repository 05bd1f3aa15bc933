#pragma once
// What the checkpoint needs of the saved-tensor offload (remat/activation_offload.h).

namespace remat::detail {

/// While alive, OffloadSavedTensors scopes on this thread offload nothing. For a pass whose graph
/// is dropped unused: a checkpoint's forward, which records its segment only to find the frontier
/// (Note [Checkpoint graph surgery] in checkpoint_node.cpp); copying its activations to the host
/// would be pure cost.
class SuppressSavedTensorOffload {
 public:
  SuppressSavedTensorOffload();
  ~SuppressSavedTensorOffload();
  SuppressSavedTensorOffload(const SuppressSavedTensorOffload&) = delete;
  SuppressSavedTensorOffload& operator=(const SuppressSavedTensorOffload&) = delete;
};

}  // namespace remat::detail
