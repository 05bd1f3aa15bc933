#pragma once
/// \file
/// Checkpoint layouts: for each block of a chain, whether its activations are kept, recomputed in
/// backward, or recomputed from a segment input offloaded to host memory. A layout generalises
/// SimpleTuner's interval and stride (every layout they can express is one of these) and is what
/// the budget planner (remat/plan.h) chooses and the models run.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "remat/checkpoint.h"
#include "remat/export.h"

namespace remat {

/// What happens to the activations of a block.
enum class BlockMode {
  Keep,       ///< not checkpointed: activations stay until backward
  Recompute,  ///< in a checkpointed segment: only the segment input is kept
  Offload,    ///< in a checkpointed segment whose input is kept in host memory (CUDA)
};

/// "keep", "recompute", "offload".
REMAT_API const char* block_mode_name(BlockMode mode);

/// Blocks [begin, end) run as one unit: plainly (Keep) or inside one checkpoint.
struct Segment {
  int64_t begin = 0;
  int64_t end = 0;
  BlockMode mode = BlockMode::Keep;
  bool operator==(const Segment& o) const {
    return begin == o.begin && end == o.end && mode == o.mode;
  }
};

/// Contiguous segments covering blocks [0, num_blocks) in order. Consecutive Keep segments are
/// equivalent to one; consecutive checkpointed segments are separate checkpoints.
struct Layout {
  std::vector<Segment> segments;

  int64_t num_blocks() const { return segments.empty() ? 0 : segments.back().end; }
  /// The mode of each block, in order.
  std::vector<BlockMode> block_modes() const;
  /// Number of checkpointed segments.
  int64_t num_checkpoints() const;
  bool operator==(const Layout& o) const { return segments == o.segments; }
};

/// Every block kept (no checkpointing).
REMAT_API Layout layout_keep_all(int64_t num_blocks);

/// SimpleTuner's segmented layout: windows of `stride` blocks (default: interval) whose first
/// `interval` blocks form one checkpoint; the rest of each window is kept. interval 1 without
/// stride is per-block checkpointing. Validation as checkpoint_sequential_state.
REMAT_API Layout layout_from_interval(int64_t num_blocks, int64_t interval,
                                      std::optional<int64_t> stride = std::nullopt,
                                      Backend backend = Backend::Recompute);

/// Throws c10::ValueError naming the first problem: gaps, overlaps, empty segments, or a
/// total different from `num_blocks`.
REMAT_API void validate_layout(const Layout& layout, int64_t num_blocks);

/// One readable line: "recompute[0-3] keep[4] offload[5-7]" (ranges inclusive).
REMAT_API std::string describe_layout(const Layout& layout);

/// Runs the blocks of `layout` over `state`: Keep segments plainly, the others each through one
/// remat::checkpoint with the matching backend. Same ownership rules as
/// checkpoint_sequential_state (run_block is copied and kept until backward).
REMAT_API Tensors run_layout(const Layout& layout, Tensors state, const RunBlock& run_block,
                             bool preserve_rng_state = true);

}  // namespace remat
