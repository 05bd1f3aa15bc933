#pragma once
/// \file
/// Gradient-checkpointing settings shared by Flux and MageFlow, with SimpleTuner's option names
/// and semantics (MODELS.md §5), plus explicit layouts chosen by a planner.
///
/// Semantics, per block stack (Flux: the double stack and the single stack separately, windows
/// restarting at 0 in each; MageFlow: its one stack):
/// - Checkpointing happens only when the module is training AND checkpointing is enabled.
/// - Layer scope (backend "torch" / "unsloth"): the stack runs through remat::run_layout with
///   layout_from_interval(num_blocks, interval, stride, backend); an unset interval (or 1) means
///   every block is its own checkpoint and the stride is then ignored, as in SimpleTuner whose
///   segmented path needs interval > 1.
/// - FFN scope (backend "torch-ffn" / "unsloth-ffn"): only the feed-forward part inside a block is
///   checkpointed. MageFlow does this in every block; Flux, as SimpleTuner's per-block path, in
///   blocks k with k % interval == 0 (every block when the interval is unset).
/// - An explicit layout (set_layouts) replaces interval, stride and scope: each stack runs its
///   layout (Keep / Recompute / Offload segments).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "remat/checkpoint.h"
#include "remat/export.h"
#include "remat/layout.h"

namespace remat::models {

/// Observer of a model's block-stack boundaries in forward, for profiling a training step at
/// them (remat::train::profile_step): called with the first block's input state (stage
/// "blocks_begin") and with the state the head reads after the last block ("blocks_end"). It
/// must not keep the tensors.
using StageObserver = std::function<void(const std::string& stage, const Tensors& state)>;

/// The checkpointing state of one model. Not thread-safe; set it between steps.
class REMAT_API GradientCheckpointing {
 public:
  /// Valid backend names: "torch", "unsloth", "torch-ffn", "unsloth-ffn".
  static const std::vector<std::string>& backend_names();

  void enable() { enabled_ = true; }
  void disable() { enabled_ = false; }
  bool enabled() const { return enabled_; }

  /// Segment size; nullopt (or 1) = per block. Throws for values < 1.
  void set_interval(std::optional<int64_t> interval);
  std::optional<int64_t> interval() const { return interval_; }

  /// One of backend_names(); throws std::invalid_argument naming the value and the valid ones.
  void set_backend(const std::string& name);
  const std::string& backend() const { return backend_; }

  /// Window stride (>= interval when both set; checked when the layout is built). Throws for < 1.
  void set_segment_stride(std::optional<int64_t> stride);
  std::optional<int64_t> segment_stride() const { return segment_stride_; }

  /// Explicit per-stack layouts (overrides interval / stride / scope). The model checks the count
  /// and the block totals. An empty vector clears them.
  void set_layouts(std::vector<Layout> layouts) { layouts_ = std::move(layouts); }
  const std::vector<Layout>& layouts() const { return layouts_; }
  bool has_layouts() const { return !layouts_.empty(); }

  /// Whether checkpointing applies now: training && enabled.
  bool active(bool training) const { return training && enabled_; }
  /// Whether the backend ends in "-ffn" (and no explicit layout is set).
  bool ffn_scope() const;
  /// Recompute for "torch*", Offload for "unsloth*".
  Backend base_backend() const;

  /// The layout of stack `stack` with `num_blocks` blocks: the explicit one when set, otherwise
  /// the one interval / stride / backend give (layer scope). Throws std::invalid_argument for a bad
  /// stride or an explicit layout of the wrong size.
  Layout layout_for(size_t stack, int64_t num_blocks) const;

  /// FFN scope: whether block k of a Flux stack checkpoints its feed-forward part.
  bool flux_ffn_block_selected(int64_t k) const {
    return !interval_.has_value() || k % *interval_ == 0;
  }

 private:
  bool enabled_ = false;
  std::optional<int64_t> interval_;
  std::string backend_ = "torch";
  std::optional<int64_t> segment_stride_;
  std::vector<Layout> layouts_;
};

/// Runs `part` of a block on `inputs`, inside one remat::checkpoint with `backend` when one is
/// given (the "-ffn" scope checkpoints a block's feed-forward part this way), plainly otherwise.
REMAT_API Tensors run_block_part(const SegmentFn& part, const Tensors& inputs,
                                 std::optional<Backend> backend);

}  // namespace remat::models
