#pragma once
// Running consecutive blocks of a chain, shared by checkpoint_sequential_state and run_layout.

#include <string>

#include <c10/util/Exception.h>

#include "remat/checkpoint.h"

namespace remat::detail {

/// Runs blocks [begin, end) over `state`, checking that each block returns as many state tensors
/// as it received; the error names `component` and the block.
inline Tensors run_blocks(const RunBlock& run_block, int64_t begin, int64_t end, Tensors state,
                          const char* component) {
  for (int64_t k = begin; k < end; ++k) {
    Tensors next = run_block(k, state);
    TORCH_CHECK(next.size() == state.size(), "[", component, "] block ", k, " returned ",
                next.size(), " state tensors, expected ", state.size(),
                " (a block must return as many state tensors as it receives)");
    state = std::move(next);
  }
  return state;
}

}  // namespace remat::detail
