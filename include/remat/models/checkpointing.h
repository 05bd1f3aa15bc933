#pragma once
/// \file
/// What Flux and MageFlow share for gradient checkpointing besides the plan itself
/// (remat/checkpoint_plan.h): the observer of the block stacks' boundaries, and running part of a
/// block inside one checkpoint (the "-ffn" scope).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "remat/checkpoint.h"
#include "remat/checkpoint_plan.h"
#include "remat/export.h"
#include "remat/layout.h"

namespace remat::models {

/// Observer of a model's block-stack boundaries in forward, for profiling a training step at
/// them (remat::train::profile_step): called with the first block's input state (stage
/// "blocks_begin") and with the state the head reads after the last block ("blocks_end"). It
/// must not keep the tensors.
using StageObserver = std::function<void(const std::string& stage, const Tensors& state)>;

/// Runs `part` of a block on `inputs`, inside one remat::checkpoint with `backend` when one is
/// given (the "-ffn" scope checkpoints a block's feed-forward part this way), plainly otherwise.
REMAT_API Tensors run_block_part(const SegmentFn& part, const Tensors& inputs,
                                 std::optional<Backend> backend);

}  // namespace remat::models
