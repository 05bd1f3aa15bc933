#include "remat/models/block_swap.h"

#include <numeric>
#include <unordered_set>

#include "remat/models/layers.h"
#include "remat/models/lora.h"
#include "remat/util/error.h"

namespace remat::models {

int64_t clamp_blocks_to_swap(int64_t requested, int64_t depth, bool* clamped) {
  if (requested < 0) {
    throw_value_error("[block_swap] musubi_blocks_to_swap must be >= 0 (0 turns block swap off), got " +
                      std::to_string(requested));
  }
  const int64_t most = std::max<int64_t>(depth - 1, 0);
  if (clamped) *clamped = requested > most;
  return std::min(requested, most);
}

Layout checkpoint_kept_blocks(const Layout& layout, int64_t begin, int64_t end) {
  Layout out;
  for (const Segment& seg : layout.segments) {
    const int64_t lo = std::max(seg.begin, begin), hi = std::min(seg.end, end);
    if (seg.mode != BlockMode::Keep || lo >= hi) {
      out.segments.push_back(seg);
      continue;
    }
    if (seg.begin < lo) out.segments.push_back({seg.begin, lo, BlockMode::Keep});
    for (int64_t b = lo; b < hi; ++b) out.segments.push_back({b, b + 1, BlockMode::Recompute});
    if (hi < seg.end) out.segments.push_back({hi, seg.end, BlockMode::Keep});
  }
  return out;
}

int64_t replace_block_swap(torch::nn::Module& model, std::shared_ptr<BlockSwap>& swap,
                           const std::vector<std::shared_ptr<torch::nn::Module>>& blocks,
                           std::vector<int64_t> stack_sizes, int64_t blocks_to_swap,
                           std::optional<at::Device> device, at::Device weights_device) {
  const int64_t count = clamp_blocks_to_swap(blocks_to_swap, static_cast<int64_t>(blocks.size()));
  const at::Device target = device.value_or(swap ? swap->device() : weights_device);
  swap.reset();
  if (count == 0) {
    if (device) model.to(target);
    return 0;
  }
  swap = std::make_shared<BlockSwap>(blocks, std::move(stack_sizes), count, target);
  swap->move_the_rest(model);
  return count;
}

BlockSwap::BlockSwap(const std::vector<std::shared_ptr<torch::nn::Module>>& blocks, std::vector<int64_t> stack_sizes,
                     int64_t blocks_to_swap, at::Device device)
    : stack_sizes_(std::move(stack_sizes)), device_(device) {
  const int64_t depth = static_cast<int64_t>(blocks.size());
  if (std::accumulate(stack_sizes_.begin(), stack_sizes_.end(), int64_t{0}) != depth) {
    throw_value_error("[block_swap] the stack sizes do not add up to the " + std::to_string(depth) + " blocks");
  }
  if (blocks_to_swap < 1 || blocks_to_swap > depth - 1) {
    throw_value_error("[block_swap] blocks to swap must be in [1, " + std::to_string(depth - 1) + "], got " +
                      std::to_string(blocks_to_swap));
  }
  count_ = blocks_to_swap;
  first_ = depth - blocks_to_swap;
  for (int64_t b = first_; b < depth; ++b) {
    // Every weight of the block but a LoRA's factors, which train on the device: a LoRA run's
    // frozen base, or a full fine-tune's trained weights (streamed both ways).
    std::unordered_set<const c10::TensorImpl*> lora_factors;
    for (const auto& p : lora_parameters(*blocks[b])) lora_factors.insert(p.unsafeGetTensorImpl());
    std::vector<at::Tensor> frozen;
    for (const auto& p : blocks[b]->parameters()) {
      if (lora_factors.count(p.unsafeGetTensorImpl()) > 0 && p.requires_grad()) continue;
      frozen.push_back(p);
      trains_weights_ = trains_weights_ || p.requires_grad();
    }
    for (const auto& buffer : blocks[b]->buffers()) frozen.push_back(buffer);
    // A quantised base weight is not a registered tensor: its bytes are the layer's own.
    for (const auto& module : blocks[b]->modules()) {
      if (const auto* linear = dynamic_cast<const LinearImpl*>(module.get())) {
        const QuantizedWeight& q = linear->quantized_weight();
        for (const at::Tensor* t : {&q.data, &q.scales, &q.scale_scales, &q.scale_offset}) {
          if (t->defined()) frozen.push_back(*t);
        }
      }
    }
    for (const auto& t : frozen) streamed_.insert(t.unsafeGetTensorImpl());
    units_.push_back(std::move(frozen));
  }
  ensure_slots(2);
}

void BlockSwap::ensure_slots(int64_t slots) {
  if (stream_ && stream_->stats().ring_slots >= slots) return;
  stream_.reset();  // gives the tensors back to the device before a larger ring takes them
  stream_ = std::make_unique<WeightStream>(units_, device_, slots);
}

std::vector<Layout> BlockSwap::prepare(std::vector<Layout> stack_layouts, bool recording) {
  std::vector<int64_t> groups(static_cast<size_t>(count_));
  if (!recording) {
    std::iota(groups.begin(), groups.end(), int64_t{0});
    stream_->set_groups(std::move(groups));
    return stack_layouts;
  }
  if (stack_layouts.size() != stack_sizes_.size()) {
    throw_value_error("[block_swap] " + std::to_string(stack_layouts.size()) + " layouts for " +
                      std::to_string(stack_sizes_.size()) + " block stacks");
  }
  int64_t stack_begin = 0, group = 0;
  for (size_t s = 0; s < stack_layouts.size(); ++s) {
    const int64_t size = stack_sizes_[s];
    Layout& layout = stack_layouts[s];
    layout = checkpoint_kept_blocks(layout, std::max<int64_t>(first_ - stack_begin, 0), size);
    for (const Segment& seg : layout.segments) {
      for (int64_t b = seg.begin; b < seg.end; ++b) {
        const int64_t global = stack_begin + b;
        if (global >= first_) groups[static_cast<size_t>(global - first_)] = group;
      }
      ++group;
    }
    stack_begin += size;
  }
  ensure_slots(WeightStream::slots_for_groups(groups));
  stream_->set_groups(std::move(groups));
  return stack_layouts;
}

void BlockSwap::move_the_rest(torch::nn::Module& model) const {
  const auto move = [&](const at::Tensor& t) {
    if (!t.defined() || streamed_.count(t.unsafeGetTensorImpl()) || t.device() == device_) return;
    t.set_data(t.to(device_));
  };
  for (const auto& p : model.parameters()) move(p);
  for (const auto& b : model.buffers()) move(b);
  for (const auto& module : model.modules()) {
    if (const auto* linear = dynamic_cast<const LinearImpl*>(module.get())) {
      const QuantizedWeight& q = linear->quantized_weight();
      for (const at::Tensor* t : {&q.data, &q.scales, &q.scale_scales, &q.scale_offset}) move(*t);
    }
  }
}

void BlockSwap::finish_backward() {
  if (trains_weights_) stream_->release_all();
}

void BlockSwap::use(int64_t global_block) {
  if (global_block >= first_) stream_->use(global_block - first_);
}

}  // namespace remat::models
