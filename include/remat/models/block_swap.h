#pragma once
/// \file
/// Block swap for a transformer's block stacks, with SimpleTuner's meaning of
/// `musubi_blocks_to_swap` (MusubiBlockSwapManager.build in simpletuner/helpers/musubi_block_swap.py):
/// the last N blocks of the model, in run order (Flux: the double blocks, then the single
/// blocks), keep their frozen weights in host memory and are streamed to the device for each use
/// (remat/weight_stream.h); N is clamped to the number of blocks less one.
///
/// In a pass with autograd recording, a streamed block must not leave its weights in the graph
/// until backward (the graph would hold device memory, or a slot that is refilled): `prepare`
/// turns every kept streamed block into a checkpoint of its own (recomputed in backward, with
/// its weights streamed in again), and makes each checkpointed segment one group of the stream.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <torch/nn/module.h>

#include "remat/export.h"
#include "remat/layout.h"
#include "remat/weight_stream.h"

namespace remat::models {

/// SimpleTuner's clamp: at most `depth` - 1 blocks are swapped. Throws c10::ValueError for a
/// negative request; sets `*clamped` when it lowered the request.
REMAT_API int64_t clamp_blocks_to_swap(int64_t requested, int64_t depth, bool* clamped = nullptr);

/// `layout` with every kept block in [begin, end) run as a checkpoint of its own (Recompute).
REMAT_API Layout checkpoint_kept_blocks(const Layout& layout, int64_t begin, int64_t end);

class REMAT_API BlockSwap {
 public:
  /// `blocks`: the model's blocks in run order, on `device` or on the host; `stack_sizes`: how many of them
  /// each stack has (their sum is blocks.size()). Streams the weights and buffers of the last
  /// `blocks_to_swap` blocks (already clamped) but LoRA factors: a LoRA run's frozen base, or a
  /// full fine-tune's trained weights, whose gradients come back to host memory and which the
  /// optimizer steps there (remat/weight_stream.h).
  BlockSwap(const std::vector<std::shared_ptr<torch::nn::Module>>& blocks, std::vector<int64_t> stack_sizes,
            int64_t blocks_to_swap, at::Device device);

  /// Global index of the first streamed block, and how many are streamed.
  int64_t first() const { return first_; }
  int64_t count() const { return count_; }
  bool streamed(int64_t global_block) const { return global_block >= first_; }

  /// The layouts to run for a pass, one per stack, from the checkpoint plan's (`stack_layouts`,
  /// empty: no checkpointing). With `recording` (autograd records the pass): kept streamed blocks
  /// become checkpoints of their own and each checkpointed segment is one group; otherwise every
  /// block is its own group and the layouts are returned as given. Rebuilds the stream's ring
  /// when the groups need more slots.
  std::vector<Layout> prepare(std::vector<Layout> stack_layouts, bool recording);

  /// Makes `global_block`'s weights resident (no-op for a block that is not streamed).
  void use(int64_t global_block);
  /// After a backward pass: with trained weights streamed, releases every block, so their
  /// gradients are on the host before the optimizer reads them (no-op for a LoRA run).
  void finish_backward();
  /// Whether trained weights are streamed (a full fine-tune).
  bool trains_weights() const { return trains_weights_; }
  /// Whether a streamed block's weights are resident now (false for a block not streamed).
  bool resident(int64_t global_block) const {
    return global_block >= first_ && stream_->resident(global_block - first_);
  }

  WeightStreamStats stats() const { return stream_->stats(); }
  at::Device device() const { return device_; }

  /// Moves every tensor of `model` the stream does not hold (the other blocks, the embedders,
  /// LoRA factors, quantised weights outside the streamed blocks) to the stream's device: with a
  /// model built on the host, the device then holds exactly what it would with the model built
  /// there and swapped.
  void move_the_rest(torch::nn::Module& model) const;

 private:
  void ensure_slots(int64_t slots);

  std::vector<std::vector<at::Tensor>> units_;
  std::unordered_set<const c10::TensorImpl*> streamed_;
  std::vector<int64_t> stack_sizes_;
  int64_t first_ = 0;
  int64_t count_ = 0;
  bool trains_weights_ = false;
  at::Device device_;
  std::unique_ptr<WeightStream> stream_;
};

/// What a model's set_block_swap does (Flux, MageFlow): replaces `swap` (the previous one gives
/// its weights back to the device first) by one streaming the last `blocks_to_swap` (clamped)
/// of `blocks` to `device` (default: the previous swap's device, else `weights_device`), and moves
/// the rest of `model` there. 0 turns it off (with `device`, the model moves there). Returns the
/// number of blocks streamed.
REMAT_API int64_t replace_block_swap(torch::nn::Module& model, std::shared_ptr<BlockSwap>& swap,
                                     const std::vector<std::shared_ptr<torch::nn::Module>>& blocks,
                                     std::vector<int64_t> stack_sizes, int64_t blocks_to_swap,
                                     std::optional<at::Device> device, at::Device weights_device);

}  // namespace remat::models
