#pragma once
/// \file
/// Activation checkpointing for LibTorch.
///
/// `checkpoint` runs a segment of a network keeping none of its intermediate activations; the
/// backward pass recomputes them. `checkpoint_sequential_state` applies it to contiguous segments
/// of a block sequence that carries a multi-tensor state (for Flux: image and text hidden states).
///
/// Gradients flow to everything the segment reads that requires grad, as with PyTorch's
/// non-reentrant `torch.utils.checkpoint`: the state tensors passed in, the parameters of modules
/// called inside, and tensors the closure captures (a timestep embedding computed outside the
/// segment by trainable layers). The caller lists none of them. See Note [Checkpoint graph
/// surgery] in src/core/detail/checkpoint_node.cpp for how.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "remat/export.h"

namespace remat {

using Tensors = std::vector<at::Tensor>;

/// A segment of a network: state in, state out. Called once in forward and once more in backward
/// (recomputation), with tensors of the same shapes.
using SegmentFn = std::function<Tensors(const Tensors&)>;

/// Where the tensors a checkpoint keeps for backward (its segment inputs) live until then.
enum class Backend {
  /// Keep them where they are (SimpleTuner option name "torch").
  Recompute,
  /// CUDA tensors go to pinned host memory by an asynchronous copy on a side stream and come back
  /// before recomputation; the previous segment's are prefetched while one segment recomputes.
  /// CPU tensors stay as they are. (SimpleTuner option name "unsloth".)
  Offload,
};

/// "torch" or "unsloth", the names SimpleTuner uses for the two backends.
REMAT_API std::string backend_name(Backend backend);
/// Parses "torch" / "unsloth"; throws c10::ValueError naming the value otherwise.
REMAT_API Backend parse_backend(const std::string& name);

struct CheckpointOptions {
  Backend backend = Backend::Recompute;
  /// Replay the random numbers of the forward pass during recomputation (dropout gives the same
  /// mask): the CPU generator and the generators of the non-CPU devices of the inputs.
  bool preserve_rng_state = true;
};

/// Runs `fn(inputs)` keeping none of its intermediate activations; backward recomputes them.
///
/// - Returns tensors with the values of `fn(inputs)`. Outputs that require grad are attached to one
///   backward node; the others (integer ids, undefined tensors) pass through without grad.
/// - Without grad mode this simply returns `fn(inputs)`.
/// - Memory kept until backward: the input tensors only (moved to host with Backend::Offload).
/// - RNG and autocast state of the forward pass are restored during recomputation.
/// - `fn` is copied and kept until the backward pass has run (or the graph is freed). Anything it
///   captures by reference (modules, context tensors, the run_block of a sequence) must outlive
///   the backward pass; capturing tensors by value is always safe.
/// - Backward with create_graph=true (double backward) is not supported and throws; running
///   backward twice needs retain_graph=true on the first call, as everywhere in autograd.
REMAT_API Tensors checkpoint(const SegmentFn& fn, const Tensors& inputs,
                             const CheckpointOptions& options = {});

/// Whether this thread is recomputing a checkpointed segment now: true while a checkpoint's
/// backward runs its segment again, false in the forward pass. Lets what a segment calls plan
/// for the backward order (remat/weight_stream.h prefetches the segment before this one).
REMAT_API bool in_recomputation();

/// A checkpoint function: calls the segment, possibly through `checkpoint`. Lets callers wrap,
/// count or replace the checkpointing of each segment.
using CheckpointFn = std::function<Tensors(const SegmentFn&, const Tensors&)>;

/// Runs block `block_index` (global index in the sequence) on `state`; returns the new state, with
/// as many tensors as it received.
using RunBlock = std::function<Tensors(int64_t block_index, const Tensors& state)>;

/// Runs blocks 0..num_blocks-1 over `state`, checkpointing contiguous segments of segment_size
/// blocks. With segment_stride s (s >= segment_size) only the first segment_size blocks of every
/// window of s blocks are checkpointed; the rest of the window runs normally.
///
/// Example: 5 blocks, segment_size 2: checkpoint_fn is called on blocks [0,1], [2,3], [4].
/// 6 blocks, segment_size 2, stride 3: [0,1] checkpointed, 2 plain, [3,4] checkpointed, 5 plain.
///
/// Throws c10::ValueError for num_blocks < 0, segment_size < 1 or segment_stride <
/// segment_size, and c10::Error naming the block when a block changes the number of state
/// tensors. `run_block` is copied into each segment and kept until backward (see `checkpoint`).
REMAT_API Tensors checkpoint_sequential_state(int64_t num_blocks, int64_t segment_size,
                                              Tensors state, const RunBlock& run_block,
                                              const CheckpointFn& checkpoint_fn,
                                              std::optional<int64_t> segment_stride = std::nullopt);

/// Same, with checkpoint_fn = remat::checkpoint(., ., options).
REMAT_API Tensors checkpoint_sequential_state(int64_t num_blocks, int64_t segment_size,
                                              Tensors state, const RunBlock& run_block,
                                              const CheckpointOptions& options = {},
                                              std::optional<int64_t> segment_stride = std::nullopt);

/// One window of a segmented sequence: blocks [begin, checkpoint_end) run in one checkpoint,
/// blocks [checkpoint_end, end) run plainly.
struct SegmentWindow {
  int64_t begin;
  int64_t checkpoint_end;
  int64_t end;
};

/// The windows checkpoint_sequential_state uses, after the same validation. Exposed so planners,
/// benchmarks and logs describe exactly what runs.
REMAT_API std::vector<SegmentWindow> segment_windows(int64_t num_blocks, int64_t segment_size,
                                                     std::optional<int64_t> segment_stride = std::nullopt);

}  // namespace remat
