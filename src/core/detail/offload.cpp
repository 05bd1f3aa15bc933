// Note [Offload pipeline]
// Backend::Offload moves the tensors a checkpoint keeps (its segment inputs) to pinned host
// memory while the forward pass goes on, and brings them back for recomputation. Everything goes
// through device-generic c10 APIs (VirtualGuardImpl streams, c10::Event, pinned_memory), so this
// file compiles, and is type-checked, in CPU-only builds too.
//
// Forward, for a tensor t on device D (compute stream S, side stream P):
//   1. record event E on S after t was produced; P waits for E;
//   2. on P: host = a pinned buffer of the pool (remat/activation_offload.h; pageable beyond its
//      cap); host.copy_(t, non_blocking);
//   3. recordDataPtrOnStream(t, P): the caching allocator will not hand t's memory to anyone
//      until P has finished the copy, although remat drops its reference at once.
// Backward, segment k (reverse order):
//   1. if not prefetched: on P, fetched = empty on D; fetched.copy_(host, non_blocking); record F;
//   2. S waits for F (the host never blocks); recordDataPtrOnStream(fetched, S);
//   3. start the prefetch of segment k-1 on P, so its copy overlaps segment k's recomputation.
// CPU tensors are kept as they are: there is nowhere cheaper to put them.
#include "detail/offload.h"

#include "detail/copy_stream.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace remat::detail {
namespace {

// The offloaded checkpoint most recently created on this thread (see SavedInputs::create).
thread_local std::weak_ptr<SavedInputs> t_last_offloaded;

}  // namespace

std::shared_ptr<SavedInputs> SavedInputs::create(const Tensors& inputs, Backend backend) {
  auto saved = std::shared_ptr<SavedInputs>(new SavedInputs());
  saved->entries_.resize(inputs.size());
  bool any_offloaded = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& input = inputs[i];
    Entry& entry = saved->entries_[i];
    if (!input.defined()) continue;
    entry.requires_grad = input.requires_grad();
    entry.device = input.device();
    if (backend == Backend::Offload && !input.device().is_cpu()) {
      saved->offload(entry, input);
      any_offloaded = true;
    } else {
      entry.data = input.detach();  // shares the version counter with `input`
      entry.version = input._version();
    }
  }
  if (any_offloaded) {
    saved->previous_ = t_last_offloaded;
    t_last_offloaded = saved;
  }
  return saved;
}

void SavedInputs::offload(Entry& entry, const at::Tensor& tensor) {
  const at::Device device = resolved_device(tensor.device());
  entry.device = device;
  c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream compute = impl.getStream(device);
  const c10::Stream side = copy_stream(device);

  c10::Event produced(device.type());
  produced.record(compute);
  produced.block(side);

  at::Tensor source = tensor.detach();
  {
    c10::StreamGuard on_side(side);
    entry.host = checkout_host_buffer(source.numel(), source.scalar_type(), /*accelerator=*/true);
    entry.data = entry.host.tensor.view(source.sizes());
    entry.data.copy_(source, /*non_blocking=*/true);
  }
  impl.recordDataPtrOnStream(source.storage().data_ptr(), side);
  entry.offloaded = true;
}

void SavedInputs::prefetch() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (released_) return;
  for (auto& entry : entries_) {
    if (!entry.offloaded || entry.fetched.defined()) continue;
    c10::impl::VirtualGuardImpl impl(entry.device.type());
    const c10::Stream side = copy_stream(entry.device);
    c10::StreamGuard on_side(side);
    // The side stream already ordered this after the copy to host (same stream).
    entry.fetched = at::empty(entry.data.sizes(), entry.data.options().device(entry.device));
    entry.fetched.copy_(entry.data, /*non_blocking=*/true);
    entry.fetched_ready.emplace(entry.device.type());
    entry.fetched_ready->record(side);
    entry.last_read.emplace(entry.device.type());
    entry.last_read->record(side);
  }
}

Tensors SavedInputs::unpack() {
  prefetch();  // no-op when the segment after this one already started it
  Tensors leaves(entries_.size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!released_, "[remat::checkpoint] the saved inputs of this checkpoint were already "
                            "freed by an earlier backward; pass retain_graph=true to the first "
                            "backward to run it twice");
    for (size_t i = 0; i < entries_.size(); ++i) {
      Entry& entry = entries_[i];
      at::Tensor value;
      if (entry.offloaded) {
        c10::impl::VirtualGuardImpl impl(entry.device.type());
        const c10::Stream compute = impl.getStream(entry.device);
        entry.fetched_ready->block(compute);
        impl.recordDataPtrOnStream(entry.fetched.storage().data_ptr(), compute);
        value = entry.fetched;
        // Keep the host copy (retain_graph may backward again); the device copy is handed out.
        entry.fetched = at::Tensor();
        entry.fetched_ready.reset();
      } else if (entry.data.defined()) {
        TORCH_CHECK(entry.data._version() == entry.version,
                    "[remat::checkpoint] input ", i, " of a checkpointed segment was modified in "
                    "place after the forward pass (version ", entry.data._version(),
                    ", saved at version ", entry.version, "); recomputation would see other values");
        value = entry.data;
      }
      if (value.defined()) {
        leaves[i] = value.detach();
        if (entry.requires_grad) leaves[i].requires_grad_(true);
      }
    }
  }
  if (auto previous = previous_.lock()) previous->prefetch();
  return leaves;
}

void SavedInputs::release() {
  std::lock_guard<std::mutex> lock(mutex_);
  released_ = true;
  give_back_host_buffers();
  entries_.clear();
}

SavedInputs::~SavedInputs() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A destructor must not throw: a pool error leaves the buffers to be freed with their tensors.
  try {
    give_back_host_buffers();
  } catch (...) {
  }
}

void SavedInputs::give_back_host_buffers() {
  for (auto& entry : entries_) {
    if (!entry.offloaded) continue;
    entry.data = at::Tensor();
    give_back_host_buffer(std::move(entry.host), std::move(entry.last_read));
    entry.offloaded = false;
  }
}

size_t SavedInputs::offloaded_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t count = 0;
  for (const auto& entry : entries_) count += entry.offloaded ? 1 : 0;
  return count;
}

}  // namespace remat::detail
