#pragma once
// The host buffers of activation offload, pooled in buckets per shape under a cap on the number of
// shapes (remat/activation_offload.h; SimpleTuner's _PinnedMemoryPool in
// simpletuner/helpers/training/offloaded_gradient_checkpointer.py). A buffer is a flat tensor of
// `numel` elements: callers copy a tensor's storage span into it and restore the view from it.

#include <cstdint>
#include <optional>

#include <ATen/Tensor.h>
#include <c10/core/Event.h>

namespace remat::detail {

struct HostBuffer {
  at::Tensor tensor;    // flat, `numel` elements on the CPU
  bool pooled = false;  // from a bucket (given back to it), or a one-off pageable buffer
  bool accelerator = false;
};

/// A host buffer of `numel` elements of `dtype`. `accelerator`: the data comes from a GPU, so a
/// pooled buffer is pinned and a pageable one is ordinary host memory; otherwise (a CPU run) both
/// are host memory outside remat's CPU tracking, which then shows what a GPU would hold.
HostBuffer checkout_host_buffer(int64_t numel, at::ScalarType dtype, bool accelerator);

/// Gives `buffer` back. `last_read`: an event recorded after the last copy out of it was queued;
/// the buffer is handed out again only once that event has completed. A pageable buffer is
/// simply freed.
void give_back_host_buffer(HostBuffer buffer, std::optional<c10::Event> last_read);

}  // namespace remat::detail
