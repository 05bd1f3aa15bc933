// Note [Checkpoint memory timeline]
// predict() replays one training step of a layout and tracks the bytes live on the device. It
// follows what remat does (Note [Checkpoint graph surgery] in src/core/detail/checkpoint_node.cpp,
// run_layout in src/core/layout.cpp, Note [Offload pipeline] in src/core/detail/offload.cpp). Symbols, for
// block k of N: A_k activation bytes, R_k retained input bytes, F_k / B_k forward / backward
// transient peaks, s_k state bytes entering block k (s_N: the chain's output), g_k its gradient.
//
// Held all step: fixed bytes, the chain input s_0 (the caller holds it), and from its creation
// the output s_N (the loss reads it). Backward starts when the caller adds g_N (held to the end).
//
// Forward, Keep block k: peak candidate live + F_k; then live += A_k + s_{k+1}, and the caller
//   drops the input state: live -= s_k - R_k (the block's graph still holds R_k of it; not for
//   k = 0, which the caller holds).
// Forward, checkpointed segment [p, q): the RNG snapshot (overhead) is taken, then the blocks run
//   with grad exactly as Keep blocks, except that the segment input s_p stays (the checkpoint
//   saves it). At the end the segment's graph is dropped: live -= sum A_k (p <= k < q) + sum R_k
//   (p < k < q), leaving s_p and the output s_q. An Offload segment whose state is on CUDA then
//   moves s_p to host: live -= s_p (unless p = 0: the caller still holds s_0).
// Backward, Keep block k: peak candidate live + B_k; then live += g_k - A_k - R_k (R_k not for
//   k = 0) - g_{k+1} (the incoming gradient is consumed; not for g_N, which the caller holds).
// Backward, checkpointed segment [p, q) (CheckpointNode::apply):
//   - an offloaded input comes back as a new device copy (+ s_p), and the previous offloaded
//     segment's input is prefetched (+ its s); predict() adds both, since they depend on other
//     segments;
//   - the RNG state of the moment is saved while recomputing (+ overhead, freed after);
//   - recomputation: the forward rules above (s_p stays, intermediate states not retained go);
//   - the inner backward: the Keep rules, except that g_q stays (apply holds the incoming
//     gradients) and R_p is the saved input itself, not freed;
//   - apply returns: the recomputed output s_q, the incoming g_q (unless q = N), the saved or
//     fetched input (unless it is s_0 kept in place) and the RNG snapshot go; g_p flows on.
//
// Parameter gradients: with gradients freed between steps, block k's backward creates P_k bytes
//   of them, live until the step ends (its measured B_k includes their creation).
//
// Peaks are sampled at every transient and after every change, so a hand-written cost with
// F_k < A_k + s_{k+1} still gives a peak no lower than the live bytes.
//
// Step time: sum of forward and backward, plus the forward of every checkpointed block again
// (recomputation), plus, for an offloaded segment, the copy time s_p / bandwidth in each
// direction minus the computation it overlaps (the segment's forward for the copy out, its
// recomputation and backward for the copy back, an approximation: the real copy back overlaps
// the next offloaded segment's backward).
// Note [Whole-step model]
// A training step is more than the chain: the embedders before it, the output head and the loss
// after it, the optimizer step at the end. They do not depend on the layout, so the Chain carries
// them as measured figures (remat::train::profile_step measures them in a real step at stage
// boundaries; see src/ui/step_profile.cpp):
//   - fixed_bytes: everything live while the chain runs besides its state (parameters, optimizer
//     state, the batch, what the embedders' graph keeps, RoPE tables, the conditioning);
//   - tail_peak_bytes T: after the last block's forward, the head and loss forward and their
//     backward reach at most live + T, where live includes every block's kept activations; so a
//     layout's K (kept bytes) shows up here too;
//   - tail_backward_bytes U: when the backward reaches the chain, the live bytes are those at the
//     end of the forward + g_N + U (U < 0 when the head freed the chain output and the loss's
//     inputs);
//   - fixed_peak_bytes: the embedders' forward and backward, the optimizer step: moments when no
//     block keeps activations, the same for every layout;
//   - fixed_time_s: their time.
// predict adds T as a transient at the chain's end, U with g_N, and takes the step's peak as the
// larger of the timeline's and fixed_peak_bytes.
#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "plan/cost_model_impl.h"
#include "remat/saved_inputs.h"

#include "remat/util/error.h"

namespace remat {
namespace detail {
namespace {

[[noreturn]] void invalid(const std::string& message) { throw_value_error(message); }

void check_non_negative(int64_t value, size_t block, const char* name) {
  if (value < 0) {
    invalid("[Chain] blocks[" + std::to_string(block) + "]." + name + " must be >= 0, got " +
            std::to_string(value));
  }
}

void check_non_negative(double value, size_t block, const char* name) {
  if (!(value >= 0.0)) {
    std::ostringstream msg;
    msg << "[Chain] blocks[" << block << "]." << name << " must be >= 0, got " << value;
    invalid(msg.str());
  }
}

}  // namespace

int64_t state_bytes(const Chain& chain, int64_t k) {
  const int64_t n = chain.num_blocks();
  return k < n ? chain.blocks[k].boundary_bytes : chain.blocks[n - 1].output_bytes;
}

int64_t state_grad_bytes(const Chain& chain, int64_t k) {
  const int64_t n = chain.num_blocks();
  return k < n ? chain.blocks[k].boundary_grad_bytes : chain.blocks[n - 1].output_grad_bytes;
}

// What a checkpointed segment's saved inputs cost is its saved-input policy's to say.
const SavedInputPolicy* policy_of(BlockMode mode) {
  if (mode == BlockMode::Keep) return nullptr;
  return &saved_input_policy(mode == BlockMode::Offload ? Backend::Offload : Backend::Recompute);
}

bool moves_to_host(const Chain& chain, BlockMode mode) {
  const SavedInputPolicy* policy = policy_of(mode);
  return policy != nullptr && policy->bytes_moved(1, chain.offload_to_host) > 0;
}

void validate_layout_for_chain(const Chain& chain, const Layout& layout) {
  validate_layout(layout, chain.num_blocks());
  for (const auto& segment : layout.segments) {
    if (segment.mode == BlockMode::Keep) continue;  // a Keep run is the same split or not
    for (int64_t b : chain.forced_boundaries) {
      if (segment.begin < b && b < segment.end) {
        invalid("[predict] checkpointed segment " + std::string(block_mode_name(segment.mode)) + "[" +
                std::to_string(segment.begin) + "-" + std::to_string(segment.end - 1) +
                "] must not cross the forced boundary at block " + std::to_string(b));
      }
    }
  }
}

double segment_time(const Chain& chain, const Segment& segment, double* recompute_s,
                    double* transfer_s) {
  double forward = 0.0, backward = 0.0;
  for (int64_t k = segment.begin; k < segment.end; ++k) {
    forward += chain.blocks[k].forward_s;
    backward += chain.blocks[k].backward_s;
  }
  const double recompute = segment.mode == BlockMode::Keep ? 0.0 : forward;
  double transfer = 0.0;
  if (moves_to_host(chain, segment.mode)) {
    // One direction's copy overlaps the forward pass, the other the recomputation and backward.
    const int64_t moved = policy_of(segment.mode)->bytes_moved(state_bytes(chain, segment.begin),
                                                               chain.offload_to_host);
    const double copy = static_cast<double>(moved) / 2.0 / chain.host_bandwidth_bytes_per_s;
    transfer = std::max(0.0, copy - forward) + std::max(0.0, copy - (recompute + backward));
  }
  if (recompute_s != nullptr) *recompute_s += recompute;
  if (transfer_s != nullptr) *transfer_s += transfer;
  return forward + backward + recompute + transfer;
}

Timeline::Timeline(const Chain& chain, int64_t live) : chain_(chain), live_(live), peak_(live) {}

void Timeline::bump(int64_t transient, int64_t block) {
  current_block_ = block;
  if (live_ + transient > peak_) {
    peak_ = live_ + transient;
    peak_block_ = block;
    peak_in_backward_ = backward_;
  }
}

void Timeline::bump_tail(int64_t transient, int64_t block) { bump(transient, block); }

void Timeline::add(int64_t bytes) {
  live_ += bytes;
  bump(0, current_block_);
}

void Timeline::run_forward_blocks(int64_t begin, int64_t end, bool checkpointed) {
  for (int64_t k = begin; k < end; ++k) {
    const BlockCost& block = chain_.blocks[k];
    bump(block.forward_peak_bytes, k);
    live_ += block.activation_bytes + state_bytes(chain_, k + 1);
    // The input state goes when its last holder lets go: the caller (run_layout moves on), but
    // not the chain input (held by the caller) nor a checkpoint's input (saved).
    const bool input_pinned = k == 0 || (checkpointed && k == begin);
    if (!input_pinned) live_ -= state_bytes(chain_, k) - block.retained_input_bytes;
    bump(0, k);
  }
}

void Timeline::run_backward_blocks(int64_t begin, int64_t end, bool checkpointed) {
  const int64_t n = chain_.num_blocks();
  for (int64_t k = end - 1; k >= begin; --k) {
    const BlockCost& block = chain_.blocks[k];
    bump(block.backward_peak_bytes, k);
    live_ += state_grad_bytes(chain_, k) - block.activation_bytes + block.parameter_grad_bytes;
    const bool input_pinned = k == 0 || (checkpointed && k == begin);
    if (!input_pinned) live_ -= block.retained_input_bytes;
    // The incoming gradient is consumed, unless the caller (g_N) or CheckpointNode::apply (the
    // segment's g_end) still holds it.
    const bool grad_held = k + 1 == n || (checkpointed && k + 1 == end);
    if (!grad_held) live_ -= state_grad_bytes(chain_, k + 1);
    bump(0, k);
  }
}

void Timeline::forward_segment(const Segment& segment) {
  const int64_t p = segment.begin, q = segment.end;
  if (segment.mode == BlockMode::Keep) {
    run_forward_blocks(p, q, /*checkpointed=*/false);
    return;
  }
  live_ += chain_.checkpoint_overhead_bytes;
  bump(0, p);
  run_forward_blocks(p, q, /*checkpointed=*/true);
  for (int64_t k = p; k < q; ++k) {
    live_ -= chain_.blocks[k].activation_bytes;
    if (k > p) live_ -= chain_.blocks[k].retained_input_bytes;
  }
  if (moves_to_host(chain_, segment.mode) && p > 0) live_ -= state_bytes(chain_, p);
}

void Timeline::backward_segment(const Segment& segment) {
  const int64_t p = segment.begin, q = segment.end;
  if (segment.mode == BlockMode::Keep) {
    run_backward_blocks(p, q, /*checkpointed=*/false);
    return;
  }
  const int64_t overhead = chain_.checkpoint_overhead_bytes;
  live_ += overhead;  // RngFork keeps the generator state of the moment during recomputation
  bump(0, q - 1);
  run_forward_blocks(p, q, /*checkpointed=*/true);
  live_ -= overhead;
  run_backward_blocks(p, q, /*checkpointed=*/true);
  live_ -= state_bytes(chain_, q);  // the recomputed output
  if (q < chain_.num_blocks()) live_ -= state_grad_bytes(chain_, q);
  // A moved input's fetched copy always goes; an input kept in place goes unless it is s_0.
  if (moves_to_host(chain_, segment.mode) || p > 0) live_ -= state_bytes(chain_, p);
  live_ -= overhead;  // the RNG snapshot, released with the node
}

SegmentLocalCost segment_local_cost(const Chain& chain, const Segment& segment) {
  const int64_t p = segment.begin, q = segment.end, n = chain.num_blocks();
  SegmentLocalCost cost;
  Timeline forward(chain, p > 0 ? state_bytes(chain, p) : 0);
  forward.forward_segment(segment);
  cost.forward_peak = forward.peak();
  cost.kept = forward.live() - state_bytes(chain, q);

  Timeline backward(chain, cost.kept + (q < n ? state_grad_bytes(chain, q) : 0));
  backward.set_phase_backward();
  if (moves_to_host(chain, segment.mode)) backward.add(state_bytes(chain, p));
  backward.backward_segment(segment);
  cost.backward_peak = backward.peak();
  cost.time_s = segment_time(chain, segment);
  return cost;
}

}  // namespace detail

void validate_chain(const Chain& chain) {
  const auto& blocks = chain.blocks;
  for (size_t k = 0; k < blocks.size(); ++k) {
    const BlockCost& b = blocks[k];
    detail::check_non_negative(b.forward_s, k, "forward_s");
    detail::check_non_negative(b.backward_s, k, "backward_s");
    detail::check_non_negative(b.activation_bytes, k, "activation_bytes");
    detail::check_non_negative(b.retained_input_bytes, k, "retained_input_bytes");
    detail::check_non_negative(b.boundary_bytes, k, "boundary_bytes");
    detail::check_non_negative(b.boundary_grad_bytes, k, "boundary_grad_bytes");
    detail::check_non_negative(b.output_bytes, k, "output_bytes");
    detail::check_non_negative(b.output_grad_bytes, k, "output_grad_bytes");
    detail::check_non_negative(b.forward_peak_bytes, k, "forward_peak_bytes");
    detail::check_non_negative(b.backward_peak_bytes, k, "backward_peak_bytes");
    detail::check_non_negative(b.parameter_grad_bytes, k, "parameter_grad_bytes");
    if (b.retained_input_bytes > b.boundary_bytes) {
      detail::invalid("[Chain] blocks[" + std::to_string(k) + "].retained_input_bytes must be <= " +
                      "boundary_bytes (" + std::to_string(b.boundary_bytes) + "), got " +
                      std::to_string(b.retained_input_bytes));
    }
    if (k + 1 < blocks.size() && (b.output_bytes != blocks[k + 1].boundary_bytes ||
                                  b.output_grad_bytes != blocks[k + 1].boundary_grad_bytes)) {
      detail::invalid("[Chain] blocks[" + std::to_string(k) + "] output_bytes / output_grad_bytes (" +
                      std::to_string(b.output_bytes) + " / " + std::to_string(b.output_grad_bytes) +
                      ") must equal blocks[" + std::to_string(k + 1) +
                      "] boundary_bytes / boundary_grad_bytes (" +
                      std::to_string(blocks[k + 1].boundary_bytes) + " / " +
                      std::to_string(blocks[k + 1].boundary_grad_bytes) +
                      "): the state passes unchanged from one block to the next");
    }
  }
  if (chain.fixed_bytes < 0) {
    detail::invalid("[Chain] fixed_bytes must be >= 0, got " + std::to_string(chain.fixed_bytes));
  }
  if (chain.checkpoint_overhead_bytes < 0) {
    detail::invalid("[Chain] checkpoint_overhead_bytes must be >= 0, got " +
                    std::to_string(chain.checkpoint_overhead_bytes));
  }
  if (chain.tail_peak_bytes < 0) {
    detail::invalid("[Chain] tail_peak_bytes must be >= 0, got " + std::to_string(chain.tail_peak_bytes));
  }
  if (chain.fixed_peak_bytes < 0) {
    detail::invalid("[Chain] fixed_peak_bytes must be >= 0, got " + std::to_string(chain.fixed_peak_bytes));
  }
  if (!(chain.fixed_time_s >= 0.0)) {
    std::ostringstream msg;
    msg << "[Chain] fixed_time_s must be >= 0, got " << chain.fixed_time_s;
    detail::invalid(msg.str());
  }
  for (int64_t b : chain.forced_boundaries) {
    if (b < 1 || b >= chain.num_blocks()) {
      detail::invalid("[Chain] forced_boundaries must be in [1, " +
                      std::to_string(chain.num_blocks() - 1) + "] (block indices where a segment " +
                      "starts), got " + std::to_string(b));
    }
  }
  if (!(chain.host_bandwidth_bytes_per_s > 0.0)) {
    std::ostringstream msg;
    msg << "[Chain] host_bandwidth_bytes_per_s must be > 0, got " << chain.host_bandwidth_bytes_per_s;
    detail::invalid(msg.str());
  }
}

Layout split_layout(const Layout& layout, const std::vector<int64_t>& boundaries) {
  Layout split;
  for (const auto& segment : layout.segments) {
    int64_t begin = segment.begin;
    for (int64_t k = segment.begin + 1; k < segment.end; ++k) {
      if (std::find(boundaries.begin(), boundaries.end(), k) == boundaries.end()) continue;
      split.segments.push_back({begin, k, segment.mode});
      begin = k;
    }
    split.segments.push_back({begin, segment.end, segment.mode});
  }
  return split;
}

Prediction predict(const Chain& chain, const Layout& layout) {
  validate_chain(chain);
  detail::validate_layout_for_chain(chain, layout);
  const int64_t n = chain.num_blocks();
  Prediction prediction;
  if (n == 0) {
    prediction.peak_bytes = std::max(chain.fixed_bytes, chain.fixed_peak_bytes);
    prediction.step_s = chain.fixed_time_s;
    return prediction;
  }
  const auto& segments = layout.segments;

  detail::Timeline timeline(chain, chain.fixed_bytes + detail::state_bytes(chain, 0));
  for (const auto& segment : segments) timeline.forward_segment(segment);
  timeline.bump_tail(chain.tail_peak_bytes, n);  // head, loss and their backward

  timeline.set_phase_backward();
  // The caller's gradient of the output, and what the head and loss leave (Note [Whole-step model]).
  timeline.add(detail::state_grad_bytes(chain, n) + chain.tail_backward_bytes);
  std::vector<bool> fetched(segments.size(), false);
  for (size_t i = segments.size(); i-- > 0;) {
    const Segment& segment = segments[i];
    if (detail::moves_to_host(chain, segment.mode)) {
      // SavedInputs::unpack: our own input (unless the segment after us prefetched it), then the
      // prefetch of the offloaded segment before us.
      if (!fetched[i]) timeline.add(detail::state_bytes(chain, segment.begin));
      fetched[i] = true;
      for (size_t j = i; j-- > 0;) {
        if (!detail::moves_to_host(chain, segments[j].mode)) continue;
        if (!fetched[j]) timeline.add(detail::state_bytes(chain, segments[j].begin));
        fetched[j] = true;
        break;
      }
    }
    timeline.backward_segment(segment);
  }

  prediction.peak_bytes = timeline.peak();
  prediction.peak_block = timeline.peak_block();
  prediction.peak_in_backward = timeline.peak_in_backward();
  if (chain.fixed_peak_bytes > prediction.peak_bytes) {
    prediction.peak_bytes = chain.fixed_peak_bytes;
    prediction.peak_block = -1;
    prediction.peak_in_backward = false;
  }
  prediction.step_s = chain.fixed_time_s;
  for (const auto& segment : segments) {
    prediction.step_s += detail::segment_time(chain, segment, &prediction.recompute_s,
                                              &prediction.transfer_s);
  }
  return prediction;
}

}  // namespace remat
