// Note [Weight stream]
// Each streamed tensor T keeps its TensorImpl for the life of the stream (modules, optimizers and
// autograd graphs refer to it); only its storage changes, through T.set_data:
//   not resident: T points at its host copy H (pinned for a GPU);
//   resident:     T points at a view of a ring slot (one flat byte buffer per slot, each tensor at
//                 a 256-byte aligned offset), filled from H.
// A slot is refilled only when its unit is released, and a unit is released only when a unit of
// another group is used: the blocks of one checkpointed segment stay together through its
// recomputation and backward (CheckpointNode::apply runs both before the backward pass moves on).
//
// On a GPU (compute stream S, copy stream P, both device-generic c10 streams):
//   release(v): T(v) -> H(v); record event Free on S: the kernels that read the slot come first;
//   load(u):    P waits Free of the slot; on P copy H(u) -> slot views (non_blocking); record
//               Ready on P;
//   use(u):     S waits Ready; T(u) -> slot views; then load the next unit of the schedule, so
//               its copy overlaps u's computation.
// The host never blocks for frozen weights.
//
// Trained weights (a full fine-tune's blocks) stream both ways. Their host copy H is the master:
// between passes T points at H, so the optimizer steps T on the host, and its state is created
// there. The gradients autograd computes while T points at a slot are device tensors; release(v)
// moves them into T.grad on the host (added to a gradient kept from an earlier micro-batch), so
// the device holds a block's weight gradients only from its backward until its group is released.
// use(u) sets a host gradient aside while T points at the slot (autograd would add the device's
// gradient into it) and release gives it back. That copy to the host is synchronous. The training
// step releases every unit after each backward (BlockSwap::finish_backward), before the
// optimizer reads the gradients.
//
// On the CPU the copies are synchronous and the ring is tracked memory,
// the host copies are not (untracked_host_empty): remat's tracked bytes show what a GPU would
// hold, which is what the tests and the planner's checks measure.
#include "remat/weight_stream.h"

#include <algorithm>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "detail/copy_stream.h"
#include "remat/checkpoint.h"
#include "remat/util/error.h"

namespace remat {
namespace {

constexpr int64_t kAlignment = 256;

int64_t aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

int64_t tensor_bytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

at::Tensor untracked_host_empty(at::IntArrayRef sizes, at::ScalarType dtype) {
  c10::Allocator* allocator = c10::GetDefaultCPUAllocator();
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const int64_t nbytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, allocator->allocate(nbytes), allocator,
                       /*resizable=*/false);
  return at::empty({0}, at::TensorOptions().dtype(dtype)).set_(storage, 0, sizes, c10::contiguous_strides(sizes));
}

struct WeightStream::State {
  struct Unit {
    std::vector<at::Tensor> tensors;  // the module's own tensors (their impls never change)
    std::vector<at::Tensor> host;     // their host copies
    std::vector<int64_t> offsets;     // byte offsets in a slot
    std::vector<at::Tensor> held_grad;  // trained tensors' host gradients, set aside while in use
    int64_t slot = -1;                // slot holding (or receiving) the unit, or -1
    bool in_use = false;              // pointed at its slot (use() ran), not just prefetched
  };
  struct Slot {
    at::Tensor buffer;  // uint8 on the device
    int64_t unit = -1;
    std::optional<c10::Event> free;   // recorded on the compute stream at release
    std::optional<c10::Event> ready;  // recorded on the copy stream after the load
  };

  at::Device device{at::kCPU};
  bool accelerator = false;
  std::vector<Unit> units;
  std::vector<Slot> slots;
  std::vector<int64_t> group;
  int64_t slot_bytes = 0;
  int64_t host_bytes = 0;
  int64_t copies = 0;
  int64_t bytes_copied = 0;
  int64_t gradient_bytes_returned = 0;

  // A host tensor for what a trained tensor's gradient holds: pinned for a GPU, outside the CPU
  // tracking on the CPU (what a GPU would not hold).
  at::Tensor host_like(const at::Tensor& t) const {
    return accelerator ? at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true))
                       : untracked_host_empty(t.sizes(), t.scalar_type());
  }

  // The gradient a trained tensor got while in its slot, moved to the host (Note [Weight stream]).
  void return_gradient(Unit& unit, size_t i) {
    at::Tensor& t = unit.tensors[i];
    at::Tensor held = std::move(unit.held_grad[i]);
    unit.held_grad[i] = at::Tensor();
    // Autograd's gradient of the slot's weights (on the CPU too: tracked memory, as a GPU's).
    const at::Tensor device_grad = t.grad();
    if (device_grad.defined()) {
      at::Tensor host = host_like(device_grad);
      host.copy_(device_grad);
      gradient_bytes_returned += tensor_bytes(host);
      held = held.defined() ? held.add_(host) : host;
    }
    t.mutable_grad() = held;
  }

  at::Tensor slot_view(const Slot& slot, const at::Tensor& host, int64_t offset) const {
    return slot.buffer.narrow(0, offset, tensor_bytes(host)).view(host.scalar_type()).view(host.sizes());
  }

  void release(int64_t u) {
    Unit& unit = units[u];
    if (unit.slot < 0) return;
    Slot& slot = slots[unit.slot];
    for (size_t i = 0; i < unit.tensors.size(); ++i) {
      const bool trained = unit.tensors[i].requires_grad() && unit.in_use;
      unit.tensors[i].set_data(unit.host[i]);
      if (trained) return_gradient(unit, i);
    }
    if (accelerator) {
      c10::impl::VirtualGuardImpl impl(device.type());
      if (!slot.free) slot.free.emplace(device.type());
      slot.free->record(impl.getStream(device));
    }
    slot.unit = -1;
    unit.slot = -1;
    unit.in_use = false;
  }

  int64_t free_slot() {
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s].unit < 0) return static_cast<int64_t>(s);
    }
    // A prefetched unit nobody used yet gives its slot up (the schedule changed under us).
    for (size_t s = 0; s < slots.size(); ++s) {
      if (!units[slots[s].unit].in_use) {
        release(slots[s].unit);
        return static_cast<int64_t>(s);
      }
    }
    TORCH_CHECK(false, "[weight_stream] all ", slots.size(),
                " ring slots hold units in use; the ring needs the largest group + 1 slots");
  }

  void load(int64_t u) {
    Unit& unit = units[u];
    if (unit.slot >= 0) return;
    const int64_t s = free_slot();
    Slot& slot = slots[s];
    slot.unit = u;
    unit.slot = s;
    if (accelerator) {
      c10::impl::VirtualGuardImpl impl(device.type());
      const c10::Stream side = detail::copy_stream(device);
      if (slot.free) slot.free->block(side);
      c10::StreamGuard on_side(side);
      for (size_t i = 0; i < unit.host.size(); ++i) {
        slot_view(slot, unit.host[i], unit.offsets[i]).copy_(unit.host[i], /*non_blocking=*/true);
      }
      if (!slot.ready) slot.ready.emplace(device.type());
      slot.ready->record(side);
    } else {
      for (size_t i = 0; i < unit.host.size(); ++i) slot_view(slot, unit.host[i], unit.offsets[i]).copy_(unit.host[i]);
    }
    ++copies;
    for (const auto& h : unit.host) bytes_copied += tensor_bytes(h);
  }

  // The unit the backward pass or the forward pass needs after `u` (Note [Weight stream]).
  int64_t next_after(int64_t u) const {
    const int64_t n = static_cast<int64_t>(units.size());
    if (!in_recomputation()) return u + 1 < n ? u + 1 : -1;
    if (u + 1 < n && group[u + 1] == group[u]) return u + 1;
    int64_t first = u;
    while (first > 0 && group[first - 1] == group[u]) --first;
    if (first == 0) return -1;
    int64_t previous_first = first - 1;
    while (previous_first > 0 && group[previous_first - 1] == group[first - 1]) --previous_first;
    return previous_first;
  }
};

WeightStream::WeightStream(std::vector<std::vector<at::Tensor>> units, at::Device device, int64_t ring_slots)
    : state_(std::make_unique<State>()) {
  State& st = *state_;
  if (units.empty()) throw_value_error("[weight_stream] no units to stream");
  if (ring_slots < 2) {
    throw_value_error("[weight_stream] ring_slots must be at least 2 (one in use, one being filled), got " +
                            std::to_string(ring_slots));
  }
  st.device = detail::resolved_device(device);
  st.accelerator = !st.device.is_cpu();
  for (size_t u = 0; u < units.size(); ++u) {
    State::Unit unit;
    int64_t offset = 0;
    for (auto& t : units[u]) {
      if (!t.defined() || t.numel() == 0) continue;
      const bool on_device = t.device() == st.device || (t.device().type() == st.device.type() && !t.device().has_index());
      if (!on_device && !t.device().is_cpu()) {
        throw_value_error("[weight_stream] unit " + std::to_string(u) + " has a tensor on " + t.device().str() +
                          "; the stream's device is " + st.device.str() + " and its tensors must be there or on the host");
      }
      at::Tensor host = st.accelerator
                            ? at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true))
                            : untracked_host_empty(t.sizes(), t.scalar_type());
      host.copy_(t.detach());
      st.host_bytes += tensor_bytes(host);
      unit.offsets.push_back(offset);
      offset += aligned(tensor_bytes(host));
      unit.tensors.push_back(t);
      unit.host.push_back(std::move(host));
      unit.held_grad.emplace_back();
      if (t.requires_grad() && t.grad().defined()) {  // a gradient the tensor had: to the host as well
        at::Tensor grad = st.host_like(t.grad());
        grad.copy_(t.grad());
        t.mutable_grad() = grad;
      }
    }
    st.slot_bytes = std::max(st.slot_bytes, offset);
    st.units.push_back(std::move(unit));
  }
  for (auto& unit : st.units) {
    for (size_t i = 0; i < unit.tensors.size(); ++i) unit.tensors[i].set_data(unit.host[i]);
  }
  st.slots.resize(static_cast<size_t>(ring_slots));
  for (auto& slot : st.slots) {
    slot.buffer = at::empty({std::max<int64_t>(st.slot_bytes, 1)}, at::TensorOptions().dtype(at::kByte).device(st.device));
  }
  st.group.resize(st.units.size());
  for (size_t u = 0; u < st.group.size(); ++u) st.group[u] = static_cast<int64_t>(u);
}

WeightStream::~WeightStream() {
  try {
    release_all();
    for (auto& unit : state_->units) {
      for (size_t i = 0; i < unit.tensors.size(); ++i) {
        at::Tensor& t = unit.tensors[i];
        t.set_data(unit.host[i].to(state_->device, unit.host[i].scalar_type(), /*non_blocking=*/false, /*copy=*/true));
        if (t.grad().defined()) t.mutable_grad() = t.grad().to(state_->device, t.grad().scalar_type(), false, true);
      }
    }
  } catch (...) {
    // A destructor must not throw; the tensors then stay on their host copies.
  }
}

void WeightStream::set_groups(std::vector<int64_t> group_of_unit) {
  State& st = *state_;
  if (group_of_unit.size() != st.units.size()) {
    throw_value_error("[weight_stream] " + std::to_string(group_of_unit.size()) + " groups for " +
                            std::to_string(st.units.size()) + " units");
  }
  for (size_t u = 1; u < group_of_unit.size(); ++u) {
    if (group_of_unit[u] < group_of_unit[u - 1]) {
      throw_value_error("[weight_stream] groups must not decrease along the units; unit " +
                              std::to_string(u) + " has group " + std::to_string(group_of_unit[u]) +
                              " after " + std::to_string(group_of_unit[u - 1]));
    }
  }
  if (slots_for_groups(group_of_unit) > static_cast<int64_t>(st.slots.size())) {
    throw_value_error("[weight_stream] a group of " + std::to_string(slots_for_groups(group_of_unit) - 1) +
                            " units needs " + std::to_string(slots_for_groups(group_of_unit)) +
                            " ring slots, the stream has " + std::to_string(st.slots.size()));
  }
  if (group_of_unit == st.group) return;
  release_all();
  st.group = std::move(group_of_unit);
}

void WeightStream::use(int64_t u) {
  State& st = *state_;
  TORCH_CHECK_INDEX(u >= 0 && u < static_cast<int64_t>(st.units.size()), "[weight_stream] unit ", u,
                    " out of range [0, ", st.units.size(), ")");
  for (size_t v = 0; v < st.units.size(); ++v) {
    if (st.units[v].in_use && st.group[v] != st.group[u]) st.release(static_cast<int64_t>(v));
  }
  State::Unit& unit = st.units[u];
  if (!unit.in_use) {
    // A trained tensor's host gradient waits aside while autograd writes the slot's (Note [Weight stream]).
    for (size_t i = 0; i < unit.tensors.size(); ++i) {
      at::Tensor& t = unit.tensors[i];
      if (t.requires_grad() && t.grad().defined()) {
        unit.held_grad[i] = t.grad();
        t.mutable_grad().reset();
      }
    }
    st.load(u);
    State::Slot& slot = st.slots[unit.slot];
    if (st.accelerator) {
      c10::impl::VirtualGuardImpl impl(st.device.type());
      slot.ready->block(impl.getStream(st.device));
    }
    for (size_t i = 0; i < unit.tensors.size(); ++i) {
      unit.tensors[i].set_data(st.slot_view(slot, unit.host[i], unit.offsets[i]));
    }
    unit.in_use = true;
  }
  const int64_t next = st.next_after(u);
  if (next >= 0) st.load(next);
}

void WeightStream::release_all() {
  for (size_t u = 0; u < state_->units.size(); ++u) state_->release(static_cast<int64_t>(u));
}

bool WeightStream::resident(int64_t unit) const { return state_->units.at(unit).in_use; }

int64_t WeightStream::slots_for_groups(const std::vector<int64_t>& group_of_unit) {
  int64_t largest = 0, run = 0;
  for (size_t u = 0; u < group_of_unit.size(); ++u) {
    run = (u > 0 && group_of_unit[u] == group_of_unit[u - 1]) ? run + 1 : 1;
    largest = std::max(largest, run);
  }
  return largest + 1;
}

WeightStreamStats WeightStream::stats() const {
  const State& st = *state_;
  WeightStreamStats s;
  s.units = static_cast<int64_t>(st.units.size());
  s.ring_slots = static_cast<int64_t>(st.slots.size());
  s.slot_bytes = st.slot_bytes;
  s.device_bytes = s.ring_slots * st.slot_bytes;
  s.host_bytes = st.host_bytes;
  s.copies = st.copies;
  s.bytes_copied = st.bytes_copied;
  s.gradient_bytes_returned = st.gradient_bytes_returned;
  for (const auto& unit : st.units) {
    for (const auto& t : unit.tensors) s.trained_tensors += t.requires_grad() ? 1 : 0;
  }
  return s;
}

at::Device WeightStream::device() const { return state_->device; }

}  // namespace remat
