#pragma once
// The tensors a checkpoint keeps for backward: its segment inputs. With Backend::Offload, CUDA
// (any non-CPU) tensors are copied to pinned host memory on a side stream and fetched back before
// recomputation; see Note [Offload pipeline] in offload.cpp.

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include "detail/host_buffer_pool.h"
#include "remat/checkpoint.h"

namespace remat::detail {

class SavedInputs : public std::enable_shared_from_this<SavedInputs> {
 public:
  /// Keeps `inputs` (detached) for recomputation. With Backend::Offload the non-CPU ones start
  /// their copy to host now, and this object becomes the one the next offloaded checkpoint of
  /// this thread prefetches after (the backward pass runs segments in reverse order).
  static std::shared_ptr<SavedInputs> create(const Tensors& inputs, Backend backend);

  size_t size() const { return entries_.size(); }

  /// Fresh leaves for recomputation, on the original devices, requiring grad where the inputs
  /// did. Waits (on the current stream, not the host) for offloaded tensors, then starts the
  /// prefetch of the segment before this one. Throws if an input kept in place was modified in
  /// place after the forward pass, since recomputation would then see different values.
  Tensors unpack();

  /// Starts the asynchronous copy of offloaded tensors back to their devices. Idempotent.
  void prefetch();

  /// Frees everything (after backward without retain_graph).
  void release();
  ~SavedInputs();
  bool released() const { return released_; }

  /// Number of tensors currently held in host memory instead of on their device.
  size_t offloaded_count() const;

 private:
  struct Entry {
    at::Tensor data;         // the input (detached), or its host copy (a view of `host`) when offloaded
    HostBuffer host;         // from the pool (remat/activation_offload.h) when offloaded
    at::Tensor fetched;      // device copy made by prefetch(), until unpack() hands it out
    bool requires_grad = false;
    uint32_t version = 0;    // version counter of `data` when saved (kept in place only)
    bool offloaded = false;
    at::Device device{at::kCPU};
    std::optional<c10::Event> fetched_ready;  // recorded on the side stream after the copy back
    std::optional<c10::Event> last_read;      // likewise, for giving `host` back to the pool
  };

  // Gives the host buffers back to the pool. Caller holds mutex_.
  void give_back_host_buffers();

  void offload(Entry& entry, const at::Tensor& tensor);

  std::vector<Entry> entries_;
  std::weak_ptr<SavedInputs> previous_;  // the offloaded checkpoint created just before this one
  mutable std::mutex mutex_;
  bool released_ = false;
};

}  // namespace remat::detail
