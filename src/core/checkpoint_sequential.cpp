// Segmented checkpointing of a block sequence (SimpleTuner's checkpoint_sequential_state).
#include <memory>
#include <stdexcept>
#include <string>

#include <c10/util/Exception.h>

#include "detail/run_blocks.h"
#include "remat/checkpoint.h"
#include "remat/util/error.h"

namespace remat {
namespace {

constexpr const char* kComponent = "checkpoint_sequential_state";

void validate(int64_t num_blocks, int64_t segment_size, std::optional<int64_t> segment_stride) {
  if (num_blocks < 0) {
    throw_value_error("[checkpoint_sequential_state] num_blocks must be >= 0, got " +
                                std::to_string(num_blocks));
  }
  if (segment_size < 1) {
    throw_value_error("[checkpoint_sequential_state] segment_size must be >= 1, got " +
                                std::to_string(segment_size));
  }
  if (segment_stride && *segment_stride < segment_size) {
    throw_value_error(
        "[checkpoint_sequential_state] segment_stride must be >= segment_size (" +
        std::to_string(segment_size) + "), got " + std::to_string(*segment_stride));
  }
}

}  // namespace

std::vector<SegmentWindow> segment_windows(int64_t num_blocks, int64_t segment_size,
                                           std::optional<int64_t> segment_stride) {
  validate(num_blocks, segment_size, segment_stride);
  const int64_t stride = segment_stride.value_or(segment_size);
  std::vector<SegmentWindow> windows;
  for (int64_t begin = 0; begin < num_blocks; begin += stride) {
    windows.push_back({begin, std::min(begin + segment_size, num_blocks),
                       std::min(begin + stride, num_blocks)});
  }
  return windows;
}

Tensors checkpoint_sequential_state(int64_t num_blocks, int64_t segment_size, Tensors state,
                                    const RunBlock& run_block, const CheckpointFn& checkpoint_fn,
                                    std::optional<int64_t> segment_stride) {
  const auto windows = segment_windows(num_blocks, segment_size, segment_stride);
  if (!run_block) throw_value_error("[checkpoint_sequential_state] run_block is empty");
  if (!checkpoint_fn) {
    throw_value_error("[checkpoint_sequential_state] checkpoint_fn is empty");
  }
  // Each segment closure is kept by its checkpoint until backward, so it owns a copy of
  // run_block (shared by all segments) rather than a reference to the caller's.
  auto block = std::make_shared<const RunBlock>(run_block);
  for (const auto& window : windows) {
    const int64_t begin = window.begin;
    const int64_t end = window.checkpoint_end;
    SegmentFn segment = [block, begin, end](const Tensors& segment_state) {
      return detail::run_blocks(*block, begin, end, segment_state, kComponent);
    };
    const size_t expected = state.size();
    state = checkpoint_fn(segment, state);
    TORCH_CHECK(state.size() == expected, "[checkpoint_sequential_state] the checkpoint of blocks [",
                begin, ", ", end, ") returned ", state.size(), " state tensors, expected ", expected);
    state = detail::run_blocks(run_block, window.checkpoint_end, window.end, std::move(state), kComponent);
  }
  return state;
}

Tensors checkpoint_sequential_state(int64_t num_blocks, int64_t segment_size, Tensors state,
                                    const RunBlock& run_block, const CheckpointOptions& options,
                                    std::optional<int64_t> segment_stride) {
  CheckpointFn checkpoint_fn = [options](const SegmentFn& fn, const Tensors& inputs) {
    return checkpoint(fn, inputs, options);
  };
  return checkpoint_sequential_state(num_blocks, segment_size, std::move(state), run_block,
                                     checkpoint_fn, segment_stride);
}

}  // namespace remat
