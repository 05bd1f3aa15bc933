#pragma once
/// \file
/// Weight streaming (block swap): the frozen weights of some blocks live in host memory and are
/// copied into a small ring of device buffers just before each use, as musubi-tuner's and
/// SimpleTuner's block swap (`musubi_blocks_to_swap`) move whole blocks between host and GPU.
///
/// A *unit* is one block's streamed tensors: the base weights of a LoRA run (in any stored
/// dtype: bf16, int8, NF4 bytes), or a full fine-tune's trained weights, which stream both ways:
/// their host copy is the master the optimizer steps, and the gradients autograd computes on the
/// device go back to it when the unit is released (Note [Weight stream]). Each streamed tensor keeps its identity: the
/// stream swaps the tensor's storage (`set_data`), so a module sees its own parameter, pointing at
/// the host copy while the unit is not resident and at a view of a ring slot while it is.
///
/// Units belong to *groups*: the blocks that must be resident together. In a training step the
/// model runs streamed blocks inside checkpointed segments (remat/checkpoint.h), and a segment's
/// recomputation and backward need all of its blocks at once, so a group is a checkpointed
/// segment; in inference a group is one block. A unit stays resident until a unit of another
/// group is used: the ring needs (largest group + 1) slots, the one extra for the prefetch.
///
/// Prefetch is a static schedule, known from the groups: in the forward pass the next unit, in
/// recomputation (remat::in_recomputation) the rest of the segment and then the first unit of
/// the segment before it, which the backward pass runs next. See Note [Weight stream] in
/// src/core/weight_stream.cpp for the copy protocol.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "remat/export.h"

namespace remat {

/// Counters of one WeightStream, for logs, tests and the planner's checks.
struct WeightStreamStats {
  int64_t units = 0;
  int64_t ring_slots = 0;
  /// Bytes of one ring slot: the largest unit, each tensor aligned to 256 bytes.
  int64_t slot_bytes = 0;
  /// Device bytes the ring holds: ring_slots * slot_bytes.
  int64_t device_bytes = 0;
  /// Host bytes of the units' copies (pinned for a GPU; outside remat's CPU tracking on CPU,
  /// so that the tracked CPU bytes show what a GPU would hold).
  int64_t host_bytes = 0;
  /// Host-to-device copies made (units), and their bytes, since construction.
  int64_t copies = 0;
  int64_t bytes_copied = 0;
  /// Streamed tensors that train (a full fine-tune's weights), and the gradient bytes moved from
  /// the device to their host copies since construction.
  int64_t trained_tensors = 0;
  int64_t gradient_bytes_returned = 0;
};

class REMAT_API WeightStream {
 public:
  /// Takes over `units` (each a list of tensors, frozen or trained; contiguous or not; on
  /// `device` or on the host, so that a model too large for the device can be built on the host):
  /// copies them (and a trained tensor's gradient) to host memory and points them there. `device`
  /// is where they are used (the model's device: a GPU, or the CPU, where the ring is real tracked
  /// memory and the copies synchronous). `ring_slots` >= 2. Throws c10::ValueError for an empty
  /// unit list, a tensor on a third device, or ring_slots < 2.
  WeightStream(std::vector<std::vector<at::Tensor>> units, at::Device device, int64_t ring_slots);
  /// Points every tensor back at device memory of its own (as before construction).
  ~WeightStream();
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;

  /// The group of each unit (non-decreasing along the units, which run in this order): set by
  /// the model from its checkpoint layout before a pass. Default: every unit its own group.
  /// Throws c10::ValueError for a wrong size or decreasing groups.
  void set_groups(std::vector<int64_t> group_of_unit);

  /// Makes unit `unit` resident before its forward (or recomputation): releases the units of
  /// other groups, waits (on the compute stream) for its copy, and starts the next prefetch.
  void use(int64_t unit);

  /// Releases every unit (end of a pass; before saving or changing the groups; after a backward,
  /// before an optimizer reads trained tensors' gradients, which are then on the host).
  void release_all();

  /// Whether `unit` is resident now.
  bool resident(int64_t unit) const;

  /// The ring slots a set of groups needs: largest group + 1.
  static int64_t slots_for_groups(const std::vector<int64_t>& group_of_unit);

  WeightStreamStats stats() const;
  at::Device device() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// An empty CPU tensor whose memory comes from LibTorch's default CPU allocator directly, not
/// through remat's tracking allocator: the host side of a simulated device (the CPU test and
/// benchmark runs of weight streaming count only what a GPU would hold).
REMAT_API at::Tensor untracked_host_empty(at::IntArrayRef sizes, at::ScalarType dtype);

}  // namespace remat
