#pragma once
// The autograd node that stands in for a checkpointed segment. See Note [Checkpoint graph
// surgery] in checkpoint_node.cpp.

#include <memory>
#include <string>

#include <torch/csrc/autograd/function.h>

#include "detail/offload.h"
#include "detail/rng.h"
#include "remat/checkpoint.h"

namespace remat::detail {

/// Runs `fn` on `inputs` with recomputation in backward: the implementation of remat::checkpoint
/// when grad mode is on.
Tensors checkpoint_with_graph_surgery(const SegmentFn& fn, const Tensors& inputs,
                                      const CheckpointOptions& options);

class CheckpointNode final : public torch::autograd::Node {
 public:
  CheckpointNode(SegmentFn fn, std::shared_ptr<SavedInputs> saved, RngSnapshot rng,
                 AutocastSnapshot autocast, bool preserve_rng);

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
  std::string name() const override { return "remat::CheckpointBackward"; }
  void release_variables() override;

 private:
  SegmentFn fn_;
  std::shared_ptr<SavedInputs> saved_;
  RngSnapshot rng_;
  AutocastSnapshot autocast_;
  bool preserve_rng_;
  size_t num_state_inputs_;
  bool released_ = false;
};

}  // namespace remat::detail
