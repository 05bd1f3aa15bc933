#pragma once
/// \file
/// `gradient_checkpointing_interval: auto`: measure one training step at the run's shapes, model
/// it as a remat::Chain (the block stacks, plus the embedders, head, loss and optimizer step as
/// measured figures; Note [Whole-step model] in src/core/plan/cost_model.cpp), and let the budget
/// planner choose the fastest checkpoint layout whose predicted peak fits the memory budget.
/// `remat train` and `remat bench` share this code.

#include <cstdint>
#include <limits>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include <torch/optim/optimizer.h>

#include "remat/compat.h"
#include "remat/export.h"
#include "remat/layout.h"
#include "remat/plan.h"
#include "remat/profile.h"
#include "remat/train/run/step.h"

namespace remat::train {

/// A measured model of one training step of a transformer at fixed shapes.
struct StepModel {
  /// The blocks of every stack in execution order (Flux: double then single, forced boundary at
  /// num_layers), with the rest of the step in fixed_bytes / tail / fixed fields.
  Chain chain;
  /// The same blocks profiled with only their feed-forward part checkpointed (the "-ffn"
  /// backends; predict it with every block kept). Set when StepProfileOptions::ffn.
  std::optional<Chain> ffn_chain;
  /// Blocks per stack (Transformer::stack_sizes()).
  std::vector<int64_t> stack_sizes;
  /// Optimizer state (optimizer_state_bytes) not allocated yet when profiling (before a first step),
  /// counted in the chain's fixed figures.
  int64_t missing_optimizer_state_bytes = 0;
  /// Seconds of one forward of each block, in chain order (for overhead estimates).
  std::vector<double> block_forward_s;
};

struct StepProfileOptions {
  /// Warm-up and repeats of each block's profile (remat::profile_block).
  ProfileOptions blocks;
  /// Also profile the blocks with FFN-only checkpointing (StepModel::ffn_chain).
  bool ffn = false;
  /// Gradients stay allocated across the step (gradient accumulation > 1): count them all step
  /// instead of as created in backward.
  bool gradients_persist = false;
};

/// Measures one step of `model` on `batch`: a forward and backward (no optimizer step; the
/// model's weights and the optimizer's state are unchanged) with the stage observer recording
/// the live bytes and peaks at the block stacks' boundaries, the blocks through
/// Transformer::block_probes and remat::profile_block, and the optimizer step's temporaries on a
/// scratch copy of the largest parameter. Uses the checkpointing the model is configured with
/// for its own step (none of its figures depend on it). Restores the global CPU generator and
/// leaves the gradients of `parameters` unset. The optimizer must come from make_optimizer.
/// Throws c10::Error when CPU memory tracking is not installed (CPU).
REMAT_API StepModel profile_step(Transformer& model, torch::optim::Optimizer& optimizer,
                                 const std::vector<at::Tensor>& parameters, const Batch& batch,
                                 const StepSettings& settings, const at::Generator& generator,
                                 const StepProfileOptions& options = {});

/// One layout over every block of the stacks, in execution order (offsets added).
REMAT_API Layout join_stack_layouts(const std::vector<Layout>& stacks);
/// The per-stack layouts of a chain layout, for CheckpointPlan::from_layouts. Throws
/// c10::ValueError when a checkpointed segment crosses a stack boundary or the sizes differ.
REMAT_API std::vector<Layout> split_stack_layout(const Layout& layout,
                                                 const std::vector<int64_t>& stack_sizes);

/// No checkpoint layout fits the memory budget; the message gives the smallest possible peak and
/// what to change.
class REMAT_API NoLayoutFits : public c10::ValueError {
 public:
  explicit NoLayoutFits(const std::string& message) : c10::ValueError(message, compat::no_backtrace()) {}
};

/// The planner's choice for a step model.
struct AutoLayout {
  PlanResult plan;
  /// plan.layout split per stack.
  std::vector<Layout> stack_layouts;
};

/// Plans for `budget_bytes` (> 0). Offload is considered when the chain's state is on CUDA and
/// allow_offload; blocks from `stream_from` on (block swap) are checkpointed one per segment
/// (PlannerOptions::stream_from). Throws NoLayoutFits when nothing fits, with the smallest
/// possible peak and what to change (the planner's explanation).
REMAT_API AutoLayout plan_auto_layout(const StepModel& model, int64_t budget_bytes, bool allow_offload = true,
                                      int64_t stream_from = std::numeric_limits<int64_t>::max());

/// The budget when none is given: memory::available_bytes(device) (CPU: tracked bytes + the
/// machine's MemAvailable; CUDA: free + reserved device memory).
REMAT_API int64_t default_memory_budget(const c10::Device& device);

/// profile_step + plan_auto_layout + set_checkpoint_plan(the chosen layouts); logs
/// describe_plan in one line through `log`. `budget_bytes` unset: default_memory_budget.
REMAT_API AutoLayout apply_auto_layout(Transformer& model, torch::optim::Optimizer& optimizer,
                                       const std::vector<at::Tensor>& parameters,
                                       const Batch& batch, const StepSettings& settings,
                                       const at::Generator& generator,
                                       std::optional<int64_t> budget_bytes,
                                       const std::function<void(const std::string&)>& log,
                                       const StepProfileOptions& options = {});

}  // namespace remat::train
