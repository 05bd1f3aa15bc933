#pragma once
/// \file
/// The memory/time model of a checkpoint layout and the budget planner that picks the fastest
/// layout fitting a memory budget (SimpleTuner's `gradient_checkpointing_interval: auto`).
///
/// A network is modelled as a *chain* of blocks that pass a state (one or more tensors) along,
/// as `run_layout` runs them. Each block is described by a `BlockCost` (measured by
/// remat/profile.h or written by hand). `predict` simulates one training step (forward, then
/// backward) of a layout block by block, following what remat's checkpointing keeps and frees
/// (Note [Checkpoint memory timeline] in src/core/plan/cost_model.cpp), and returns the peak of the
/// bytes live on the device and the step time. `plan_layout` finds, by dynamic programming, the
/// layout with the smallest predicted step time whose predicted peak fits the budget; it is exact
/// under `predict` (Note [Budget planner] in src/core/plan/plan.cpp).

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "remat/export.h"
#include "remat/layout.h"

namespace remat {

/// What one block costs in one training step, at the shapes of that step. All byte counts are
/// device bytes (tracked CPU bytes on CPU); all must be >= 0. Symbols in brackets are the ones
/// Note [Checkpoint memory timeline] uses.
struct BlockCost {
  /// Block type, for logs ("double", "single", "mlp512").
  std::string kind;
  /// Seconds of the block's forward pass [fwd].
  double forward_s = 0.0;
  /// Seconds of the block's backward pass (gradients of its inputs and parameters) [bwd].
  double backward_s = 0.0;
  /// Bytes the block's autograd graph keeps from its forward until its backward, not counting
  /// its input and output state tensors [A]. The model takes the output to be kept only by the
  /// next block and the caller (residual blocks end in an addition, which saves nothing);
  /// profile_block adds an output the graph keeps to this figure.
  int64_t activation_bytes = 0;
  /// Bytes of the block's input state that its graph keeps until its backward (a linear layer or
  /// norm reading the input saves it): usually boundary_bytes or 0 [R].
  int64_t retained_input_bytes = 0;
  /// Bytes of the state entering the block (unique storages of its state tensors) [s_k]. This is
  /// what a checkpoint starting at this block keeps.
  int64_t boundary_bytes = 0;
  /// Bytes of the gradient of that state (its tensors that require grad) [g_k].
  int64_t boundary_grad_bytes = 0;
  /// Bytes of the state the block returns [s_{k+1}]; must equal the next block's boundary_bytes.
  int64_t output_bytes = 0;
  /// Bytes of the gradient of the returned state [g_{k+1}].
  int64_t output_grad_bytes = 0;
  /// Highest bytes, above those live just before, reached while the forward runs with grad
  /// enabled (its activations, output and temporaries) [F].
  int64_t forward_peak_bytes = 0;
  /// Highest bytes, above those live just before (which include the incoming gradient), reached
  /// while its backward runs (gradient temporaries, parameter-gradient buffers, its input's
  /// gradient) [B]. Measured with the block's parameter gradients absent when training frees
  /// them between steps (then they are created during this backward and count here).
  int64_t backward_peak_bytes = 0;
  /// Bytes of parameter gradients the block's backward creates and leaves live until the step
  /// ends [P]: its trainable parameters' size when training frees gradients between steps
  /// (zero_grad(set_to_none), as remat's trainer does); 0 when the gradients live all step (count
  /// them in Chain::fixed_bytes instead).
  int64_t parameter_grad_bytes = 0;
};

/// A network as the planner sees it: the blocks run in order on one state.
struct Chain {
  /// The blocks, in the order they run.
  std::vector<BlockCost> blocks;
  /// Bytes live during the whole step whatever the layout: parameters, their gradients (as after
  /// zero_grad without set_to_none; with set_to_none the prediction is an upper bound by up to
  /// their size), optimizer state, anything else the caller holds [fixed]. In a trainer, after
  /// a first step: memory::current_bytes(device) just before a step's forward, less the input
  /// state (s_0, counted separately).
  int64_t fixed_bytes = 0;
  /// Block indices where a segment must start: no segment may contain both block b-1 and b
  /// (Flux: the double → single stream transition at block 19 of flux-dev). Values in [1, N-1].
  std::vector<int64_t> forced_boundaries;
  /// Whether an Offload segment frees the device memory of its input (state on a CUDA device).
  /// False on CPU, where Backend::Offload keeps the input in place and costs what Recompute
  /// costs; the planner then never chooses Offload.
  bool offload_to_host = false;
  /// Host <-> device copy bandwidth for offloading, bytes per second (pinned PCIe 4 x16 ≈ 20e9).
  double host_bandwidth_bytes_per_s = 20e9;
  /// Bytes each checkpoint holds from its forward to its backward besides its inputs (the RNG
  /// state snapshot: a few KiB of host memory, so 0 for device budgets; ~5 KiB on CPU). The
  /// recomputation holds the same amount again while it runs.
  int64_t checkpoint_overhead_bytes = 0;

  // ---- the rest of the training step (Note [Whole-step model] in src/core/plan/cost_model.cpp) ----
  /// Highest bytes, above those live when the chain's forward ends (its output included), reached
  /// by what runs after the chain (output head, loss) from then until the backward reaches the
  /// chain's output [T]. 0 for a bare chain.
  int64_t tail_peak_bytes = 0;
  /// Bytes the part after the chain leaves live, besides the output gradient g_N, while the
  /// chain's backward runs [U]; may be negative: the head's parameter gradients (+), minus the
  /// chain output when the head's graph was its last holder (-), minus inputs of the loss freed
  /// when the forward returned (-). 0 for a bare chain.
  int64_t tail_backward_bytes = 0;
  /// Highest bytes reached at moments of the step when no block's activations are live (before
  /// the chain's forward, after its backward, the optimizer step): a floor of the step's peak
  /// whatever the layout. 0 for a bare chain.
  int64_t fixed_peak_bytes = 0;
  /// Seconds of the step outside the chain (embedders, head, loss, optimizer step), added to
  /// every layout's step time.
  double fixed_time_s = 0.0;

  int64_t num_blocks() const { return static_cast<int64_t>(blocks.size()); }
};

/// Throws c10::ValueError naming the first problem: a negative cost (any field but
/// tail_backward_bytes), a block whose
/// output_bytes differ from the next block's boundary_bytes, a forced boundary outside
/// [1, N-1], a non-positive host bandwidth.
REMAT_API void validate_chain(const Chain& chain);

/// What `predict` expects of one step of a layout.
struct Prediction {
  /// Highest bytes live during the step, fixed_bytes included.
  int64_t peak_bytes = 0;
  /// Predicted seconds of one step: forward + backward + recomputation + exposed transfers.
  double step_s = 0.0;
  /// Of which recomputation (forward of checkpointed blocks during backward).
  double recompute_s = 0.0;
  /// Of which offload transfers not hidden behind computation.
  double transfer_s = 0.0;
  /// Block running when the peak is reached (-1: before any block runs, or outside the chain:
  /// Chain::fixed_peak_bytes; N: in the part after the chain, Chain::tail_peak_bytes).
  int64_t peak_block = -1;
  /// Whether the peak is reached in the backward pass (recomputation included).
  bool peak_in_backward = false;
};

/// `layout` with every segment that contains both blocks b-1 and b, for b in `boundaries`, cut
/// in two there; e.g. a SimpleTuner interval layout made valid for a chain with forced boundaries.
REMAT_API Layout split_layout(const Layout& layout, const std::vector<int64_t>& boundaries);

/// Simulates one training step of `layout` over `chain`: forward over the blocks, then the
/// caller's gradient of the output (output_grad_bytes of the last block, held until the step
/// ends), then backward in reverse. The chain's input state is held by the caller throughout.
/// The rest of the step enters through the Chain's tail and fixed fields (Note [Whole-step
/// model]): the peak is at least fixed_peak_bytes and the time includes fixed_time_s. Throws c10::ValueError for an invalid chain or a layout that does not cover its blocks
/// or has a checkpointed segment across a forced boundary (Keep segments may span one).
REMAT_API Prediction predict(const Chain& chain, const Layout& layout);

/// What the planner may choose.
struct PlannerOptions {
  /// Allow Offload segments (only used when chain.offload_to_host).
  bool allow_offload = true;
  /// First block whose weights are streamed from host memory (block swap,
  /// remat/weight_stream.h); the chain's length when none is. Each block from here on is a
  /// checkpointed segment of its own (Recompute or Offload): a streamed block must not be kept,
  /// or autograd would hold its weights until backward, and one block per segment keeps the ring
  /// of device buffers at its smallest, two slots (WeightStream::slots_for_groups).
  int64_t stream_from = std::numeric_limits<int64_t>::max();
};

/// The planner's answer.
struct PlanResult {
  /// The fastest layout that fits; when nothing fits, the fastest of those with the smallest
  /// possible peak. Consecutive Keep blocks are merged, except across forced boundaries.
  Layout layout;
  /// predict(chain, layout).
  Prediction prediction;
  /// Whether prediction.peak_bytes <= budget_bytes.
  bool fits = false;
  /// The budget planned for.
  int64_t budget_bytes = 0;
  /// The smallest predicted peak of any layout the options allow.
  int64_t min_possible_peak = 0;
  /// Predicted step time without checkpointing (every block kept), for comparison.
  double keep_all_step_s = 0.0;
  /// The chain's forced boundaries (describe_plan marks them with '|').
  std::vector<int64_t> forced_boundaries;
  /// One or two sentences: what was chosen and why, or, when nothing fits, what to change.
  std::string explanation;
};

/// Chooses, per block, keep / recompute / offload (recomputed and offloaded blocks grouped into
/// checkpointed segments) to minimise predicted step time subject to predicted peak <=
/// budget_bytes. Exact under `predict`. Throws c10::ValueError for an invalid chain or
/// budget_bytes <= 0.
REMAT_API PlanResult plan_layout(const Chain& chain, int64_t budget_bytes,
                                 const PlannerOptions& options = {});

/// One log line, e.g. "auto: recompute[0-3] keep[4-18] | recompute[19-56]: predicted peak
/// 18.20 GiB of 20.00 GiB budget, step 1.31 s (+12% over no checkpointing)", or, when nothing
/// fits, the layout with the smallest peak followed by the explanation.
REMAT_API std::string describe_plan(const PlanResult& result);

}  // namespace remat
