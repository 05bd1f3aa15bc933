// Note [Host buffer pool]
// Buckets are keyed by (element count, dtype, accelerator) and admitted first come, first served
// up to the cap: a training loop's shapes repeat every step, so the shapes seen first are the
// ones that recur (SimpleTuner's pool also evicts a resident bucket for a more frequently used
// newcomer; with remat's fixed shapes per step that never triggers, and an aspect-bucketed run
// with more shapes than the cap keeps its first ones). A bucket grows to as many buffers as are
// out at once (a step offloads many tensors of one shape) and keeps them for the next step. A
// buffer given back is reusable once the event recorded after its last read has completed, so a
// host buffer is never overwritten while a copy out of it may still be queued.
#include "detail/host_buffer_pool.h"

#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "remat/activation_offload.h"
#include "remat/weight_stream.h"

namespace remat::detail {

using HostBufferKey = std::tuple<int64_t, at::ScalarType, bool>;

struct HostBucket {
  int64_t admitted = 0;  // admission order, for dropping the newest when the cap is lowered
  std::vector<at::Tensor> idle;
  std::vector<std::pair<c10::Event, at::Tensor>> pending;
  int64_t buffers = 0;  // allocated for this bucket and not freed
  int64_t buffer_bytes = 0;

  void drain() {
    for (size_t i = 0; i < pending.size();) {
      if (pending[i].first.query()) {
        idle.push_back(std::move(pending[i].second));
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
};

struct HostPool {
  std::mutex mutex;
  int64_t max_buckets = kDefaultOffloadPinMemoryMaxBuckets;
  int64_t admissions = 0;
  std::map<HostBufferKey, HostBucket> buckets;
  OffloadPoolStats counters;  // the event counters; the state fields are computed in stats()

  static HostPool& instance() {
    static HostPool pool;
    return pool;
  }

  // Drops the newest buckets until at most `cap` remain; their buffers in use are freed when
  // they come back (no bucket takes them).
  void shrink_to(int64_t cap) {
    while (static_cast<int64_t>(buckets.size()) > cap) {
      auto newest = buckets.begin();
      for (auto it = buckets.begin(); it != buckets.end(); ++it) {
        if (it->second.admitted > newest->second.admitted) newest = it;
      }
      buckets.erase(newest);
    }
  }
};

namespace {

at::Tensor allocate(int64_t numel, at::ScalarType dtype, bool accelerator, bool pinned) {
  if (!accelerator) return untracked_host_empty({numel}, dtype);
  return at::empty({numel}, at::TensorOptions().dtype(dtype).device(at::kCPU).pinned_memory(pinned));
}

}  // namespace

HostBuffer checkout_host_buffer(int64_t numel, at::ScalarType dtype, bool accelerator) {
  HostPool& pool = HostPool::instance();
  std::lock_guard<std::mutex> lock(pool.mutex);
  ++pool.counters.checkouts;
  const HostBufferKey key{numel, dtype, accelerator};
  auto it = pool.buckets.find(key);
  if (it == pool.buckets.end()) {
    if (static_cast<int64_t>(pool.buckets.size()) >= pool.max_buckets) {
      ++pool.counters.cap_misses;
      return {allocate(numel, dtype, accelerator, /*pinned=*/false), false, accelerator};
    }
    it = pool.buckets.emplace(key, HostBucket{}).first;
    it->second.admitted = ++pool.admissions;
  }
  HostBucket& bucket = it->second;
  ++pool.counters.pooled_checkouts;
  bucket.drain();
  if (!bucket.idle.empty()) {
    ++pool.counters.reuses;
    at::Tensor buffer = std::move(bucket.idle.back());
    bucket.idle.pop_back();
    return {std::move(buffer), true, accelerator};
  }
  at::Tensor buffer = allocate(numel, dtype, accelerator, /*pinned=*/true);
  ++bucket.buffers;
  bucket.buffer_bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  return {std::move(buffer), true, accelerator};
}

void give_back_host_buffer(HostBuffer buffer, std::optional<c10::Event> last_read) {
  if (!buffer.pooled || !buffer.tensor.defined()) return;  // pageable: freed with the tensor
  HostPool& pool = HostPool::instance();
  std::lock_guard<std::mutex> lock(pool.mutex);
  auto it = pool.buckets.find(HostBufferKey{buffer.tensor.numel(), buffer.tensor.scalar_type(), buffer.accelerator});
  if (it == pool.buckets.end()) return;  // its bucket was dropped (a lower cap): freed here
  if (last_read) {
    it->second.pending.emplace_back(std::move(*last_read), std::move(buffer.tensor));
  } else {
    it->second.idle.push_back(std::move(buffer.tensor));
  }
}

}  // namespace remat::detail

namespace remat {

void set_offload_pin_memory_max_buckets(int64_t max_buckets) {
  TORCH_CHECK_VALUE(max_buckets >= 0, "gradient_checkpointing_offload_pin_memory_max_buckets must be a "
                                      "non-negative integer (0: no pinned buffers), got ", max_buckets);
  auto& pool = detail::HostPool::instance();
  std::lock_guard<std::mutex> lock(pool.mutex);
  pool.max_buckets = max_buckets;
  pool.shrink_to(max_buckets);
}

int64_t offload_pin_memory_max_buckets() {
  auto& pool = detail::HostPool::instance();
  std::lock_guard<std::mutex> lock(pool.mutex);
  return pool.max_buckets;
}

OffloadPoolStats offload_pool_stats() {
  auto& pool = detail::HostPool::instance();
  std::lock_guard<std::mutex> lock(pool.mutex);
  OffloadPoolStats stats = pool.counters;
  stats.buckets = static_cast<int64_t>(pool.buckets.size());
  stats.idle_buffers = 0;
  stats.pooled_bytes = 0;
  for (auto& [key, bucket] : pool.buckets) {
    bucket.drain();
    stats.idle_buffers += static_cast<int64_t>(bucket.idle.size());
    stats.pooled_bytes += bucket.buffers * bucket.buffer_bytes;
  }
  return stats;
}

void reset_offload_pool_stats() {
  auto& pool = detail::HostPool::instance();
  std::lock_guard<std::mutex> lock(pool.mutex);
  pool.counters = OffloadPoolStats{};
}

void release_offload_pool() {
  auto& pool = detail::HostPool::instance();
  std::lock_guard<std::mutex> lock(pool.mutex);
  for (auto it = pool.buckets.begin(); it != pool.buckets.end();) {
    detail::HostBucket& bucket = it->second;
    bucket.drain();
    bucket.buffers -= static_cast<int64_t>(bucket.idle.size());
    bucket.idle.clear();
    it = bucket.buffers == 0 && bucket.pending.empty() ? pool.buckets.erase(it) : std::next(it);
  }
}

}  // namespace remat
