#pragma once
// Building blocks of the memory/time model shared by predict() (cost_model.cpp) and the budget
// planner (plan.cpp). See Note [Checkpoint memory timeline] in cost_model.cpp.

#include <cstdint>

#include "remat/layout.h"
#include "remat/plan.h"

namespace remat::detail {

/// s_k: bytes of the state entering block k (k < N) or leaving the chain (k == N).
int64_t state_bytes(const Chain& chain, int64_t k);
/// g_k: bytes of the gradient of that state.
int64_t state_grad_bytes(const Chain& chain, int64_t k);

/// Whether a segment of this mode moves its input off the device (Offload with state on CUDA).
bool moves_to_host(const Chain& chain, BlockMode mode);

/// Throws c10::ValueError if `layout` does not cover the chain's blocks or a segment
/// crosses a forced boundary.
void validate_layout_for_chain(const Chain& chain, const Layout& layout);

/// Predicted seconds of one segment: forward + backward, + recomputation when checkpointed,
/// + offload transfers not hidden behind the segment's own computation.
double segment_time(const Chain& chain, const Segment& segment, double* recompute_s = nullptr,
                    double* transfer_s = nullptr);

/// The live bytes of one step, advanced segment by segment. Peaks are sampled wherever live
/// bytes grow (a block's transient peak on top of what is live when it starts).
class Timeline {
 public:
  Timeline(const Chain& chain, int64_t live);

  /// The forward pass of `segment` (Note [Checkpoint memory timeline], forward rules).
  void forward_segment(const Segment& segment);
  /// The backward pass of `segment`, recomputation included. For a segment that moves its input
  /// to host, the caller adds the fetched copy (add()) before and the segment frees it at the end.
  void backward_segment(const Segment& segment);

  /// Bytes that appear (> 0) or go away (< 0) outside the blocks: the caller's output gradient,
  /// an offloaded input fetched back.
  void add(int64_t bytes);

  /// A transient of `transient` bytes above the live ones, attributed to `block` (N: the part
  /// after the chain).
  void bump_tail(int64_t transient, int64_t block);

  void set_phase_backward() { backward_ = true; }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  int64_t peak_block() const { return peak_block_; }
  bool peak_in_backward() const { return peak_in_backward_; }

 private:
  void bump(int64_t transient, int64_t block);
  void run_forward_blocks(int64_t begin, int64_t end, bool checkpointed);
  void run_backward_blocks(int64_t begin, int64_t end, bool checkpointed);

  const Chain& chain_;
  int64_t live_;
  int64_t peak_;
  int64_t peak_block_ = -1;
  int64_t current_block_ = -1;  // the block last run, for add()
  bool peak_in_backward_ = false;
  bool backward_ = false;
};

/// What one segment does, relative to what is live before it (Note [Budget planner]):
/// the bytes it leaves on the device from its forward to its backward, and its highest live
/// bytes in forward and in backward above (fixed + earlier segments' kept bytes).
struct SegmentLocalCost {
  int64_t kept = 0;
  int64_t forward_peak = 0;
  int64_t backward_peak = 0;
  double time_s = 0.0;
};

/// The local cost of `segment` in `chain`, by running it alone on a Timeline. For a segment that
/// moves its input to host, backward_peak includes its own fetched input but not the prefetched
/// input of an earlier offloaded segment (the planner adds that).
SegmentLocalCost segment_local_cost(const Chain& chain, const Segment& segment);

}  // namespace remat::detail
