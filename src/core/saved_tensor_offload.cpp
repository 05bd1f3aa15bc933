// Note [Saved-tensor offload]
// LibTorch creates a SavedVariable for every tensor an op saves for backward, and asks the
// default engine for hooks first (SavedVariable::get_default_hooks -> Engine::
// get_default_saved_variable_hooks, torch/csrc/autograd/saved_variable.cpp); the base engine
// answers none, PyTorch's Python engine answers the Python hooks of saved_tensors_hooks. remat's
// OffloadEngine is the base engine plus one answer: while an OffloadSavedTensors scope is open on
// the calling thread, an OffloadHooks object. Everything else (execution, threads) is inherited.
//
// Pack (forward, inside the scope), for a non-leaf tensor t on device D:
//   the storage span t covers (its elements and any gaps between them) is copied into a flat
//   host buffer, so that unpack rebuilds the very same strides and backward computes bitwise what
//   it would have computed from t. On an accelerator: compute stream S records an event, the copy
//   stream P waits for it, the copy runs on P, and recordDataPtrOnStream(t, P) keeps the caching
//   allocator from reusing t's memory before P has read it, although the hooks drop t at once.
// Unpack (backward):
//   unless prefetched, the span is copied back (on P, into memory of D), S waits for P's event and
//   the copy is recorded on S; the result is the span viewed with t's sizes and strides. The host
//   buffer is kept until the SavedVariable dies (backward with retain_graph may unpack again),
//   then goes back to the pool with an event after its last read.
// Prefetch: each scope is a group linked to the last group on the same thread that offloaded
//   anything (scopes inside a checkpoint's forward save nothing and are skipped); the first
//   unpack of a group starts the copy back of that group's tensors not unpacked yet. Groups made
//   while a checkpoint recomputes link to the groups recomputed before them, which backward has
//   consumed already: a recomputed block's tensors come back just in time.
#include "remat/activation_offload.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include "detail/copy_stream.h"
#include "detail/host_buffer_pool.h"
#include "detail/saved_tensor_offload.h"

namespace remat {
namespace {

struct Counters {
  std::atomic<int64_t> tensors_offloaded{0};
  std::atomic<int64_t> tensors_kept{0};
  std::atomic<int64_t> tensors_restored{0};
  std::atomic<int64_t> bytes_to_host{0};
  std::atomic<int64_t> bytes_to_device{0};
  std::atomic<int64_t> prefetched{0};
} g_counters;

// One tensor a scope saved.
struct SavedEntry {
  at::Tensor kept;  // a leaf, kept as it is
  detail::HostBuffer host;
  std::vector<int64_t> sizes, strides;
  at::Device device{at::kCPU};
  bool unpacked = false;
  at::Tensor fetched;  // its span back on the device, until unpack hands it out
  std::optional<c10::Event> fetched_ready;
  std::optional<c10::Event> last_read;  // after the latest copy out of `host`

  bool accelerator() const { return !device.is_cpu(); }
  int64_t span_bytes() const { return host.tensor.numel() * static_cast<int64_t>(host.tensor.element_size()); }

  ~SavedEntry() {
    // A destructor must not throw: a pool error leaves the buffer to be freed with the tensor.
    try {
      detail::give_back_host_buffer(std::move(host), std::move(last_read));
    } catch (...) {
    }
  }
};

// The tensors one scope saved, in pack order.
struct SavedGroup {
  std::mutex mutex;
  SavedTensorOffload options;
  std::vector<std::weak_ptr<SavedEntry>> entries;
  std::weak_ptr<SavedGroup> previous;
  bool unpacked = false;  // the first unpack starts the previous group's prefetch

  // Copies `entry` back to its device unless it is there already. Caller holds `mutex`.
  static void fetch(SavedEntry& entry) {
    if (entry.fetched.defined() || !entry.host.tensor.defined()) return;
    const at::Tensor& host = entry.host.tensor;
    if (!entry.accelerator()) {
      entry.fetched = at::empty({host.numel()}, host.options());
      entry.fetched.copy_(host);
    } else {
      c10::impl::VirtualGuardImpl impl(entry.device.type());
      const c10::Stream side = detail::copy_stream(entry.device);
      c10::StreamGuard on_side(side);
      // Ordered after the copy to host: both run on the copy stream.
      entry.fetched = at::empty({host.numel()}, host.options().device(entry.device).pinned_memory(false));
      entry.fetched.copy_(host, /*non_blocking=*/true);
      entry.fetched_ready.emplace(entry.device.type());
      entry.fetched_ready->record(side);
      entry.last_read.emplace(entry.device.type());
      entry.last_read->record(side);
    }
    g_counters.bytes_to_device += entry.span_bytes();
  }

  void prefetch_all() {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& weak : entries) {
      if (auto entry = weak.lock()) {
        if (entry->unpacked || entry->fetched.defined() || !entry->host.tensor.defined()) continue;
        fetch(*entry);
        ++g_counters.prefetched;
      }
    }
  }
};

// The last group of this thread that offloaded a tensor: what a new group prefetches.
thread_local std::weak_ptr<SavedGroup> t_last_filled;

// The storage span of `t` from its first element: every element of `t` lies in it (strides of
// ATen tensors are non-negative).
int64_t storage_span(const at::Tensor& t) {
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  return span;
}

class OffloadHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit OffloadHooks(std::shared_ptr<SavedGroup> group) : group_(std::move(group)) {}

  void call_pack_hook(const at::Tensor& tensor) override {
    entry_ = std::make_shared<SavedEntry>();
    // Leaves stay (SimpleTuner's rule), and so does what a flat span cannot hold: empty tensors,
    // other layouts (sparse, MKL-DNN), lazily conjugated or negated views, meta tensors.
    if (tensor.is_leaf() || tensor.numel() == 0 || tensor.layout() != at::kStrided || tensor.is_conj() ||
        tensor.is_neg() || tensor.device().type() == at::kMeta) {
      entry_->kept = tensor;
      ++g_counters.tensors_kept;
      return;
    }
    const at::NoGradGuard no_grad;  // the copies are not part of the graph
    const at::Tensor source = tensor.detach();
    SavedEntry& entry = *entry_;
    entry.sizes = source.sizes().vec();
    entry.strides = source.strides().vec();
    entry.device = detail::resolved_device(source.device());
    const at::Tensor span = source.as_strided({storage_span(source)}, {1}, source.storage_offset());
    entry.host = detail::checkout_host_buffer(span.numel(), span.scalar_type(), entry.accelerator());
    if (!entry.accelerator()) {
      entry.host.tensor.copy_(span);
    } else {
      c10::impl::VirtualGuardImpl impl(entry.device.type());
      const c10::Stream compute = impl.getStream(entry.device);
      const c10::Stream side = detail::copy_stream(entry.device);
      c10::Event produced(entry.device.type());
      produced.record(compute);
      produced.block(side);
      {
        c10::StreamGuard on_side(side);
        entry.host.tensor.copy_(span, /*non_blocking=*/true);
      }
      impl.recordDataPtrOnStream(source.storage().data_ptr(), side);
    }
    ++g_counters.tensors_offloaded;
    g_counters.bytes_to_host += entry.span_bytes();
    std::lock_guard<std::mutex> lock(group_->mutex);
    if (group_->entries.empty()) t_last_filled = group_;  // packing runs on the scope's thread
    group_->entries.push_back(entry_);
  }

  at::Tensor call_unpack_hook() override {
    TORCH_CHECK(entry_, "[remat::OffloadSavedTensors] a saved tensor was unpacked before it was packed");
    if (entry_->kept.defined() || !entry_->host.tensor.defined()) return entry_->kept;
    std::shared_ptr<SavedGroup> previous;
    at::Tensor value;
    {
      std::lock_guard<std::mutex> lock(group_->mutex);
      SavedEntry& entry = *entry_;
      SavedGroup::fetch(entry);
      if (entry.accelerator()) {
        c10::impl::VirtualGuardImpl impl(entry.device.type());
        const c10::Stream compute = impl.getStream(entry.device);
        entry.fetched_ready->block(compute);
        impl.recordDataPtrOnStream(entry.fetched.storage().data_ptr(), compute);
        entry.fetched_ready.reset();
      }
      value = entry.fetched.as_strided(entry.sizes, entry.strides, 0);
      entry.unpacked = true;
      ++g_counters.tensors_restored;
      entry.fetched = at::Tensor();  // handed out; the host copy stays for another backward
      if (!group_->unpacked && group_->options.prefetch) previous = group_->previous.lock();
      group_->unpacked = true;
    }
    if (previous) previous->prefetch_all();
    return value;
  }

 private:
  std::shared_ptr<SavedGroup> group_;
  std::shared_ptr<SavedEntry> entry_;
};

}  // namespace

struct OffloadSavedTensors::Scope {
  std::shared_ptr<SavedGroup> group;  // null: a disabled scope inside an enabled one
};

namespace {

thread_local OffloadSavedTensors::Scope* t_scope = nullptr;
thread_local int t_suppressed = 0;  // SuppressSavedTensorOffload depth

class OffloadEngine final : public torch::autograd::Engine {
 public:
  static torch::autograd::Engine& get() {
    static OffloadEngine engine;
    return engine;
  }

  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (t_scope == nullptr || !t_scope->group || t_suppressed > 0) return nullptr;
    return std::make_unique<OffloadHooks>(t_scope->group);
  }
};

void install_offload_engine() {
  static std::once_flag once;
  static bool installed = false;
  std::call_once(once, [] {
    using torch::autograd::Engine;
    if (&Engine::get_default_engine() != &Engine::get_base_engine()) return;
    torch::autograd::set_default_engine_stub(&OffloadEngine::get);
    installed = true;
  });
  TORCH_CHECK(installed || &torch::autograd::Engine::get_default_engine() == &OffloadEngine::get(),
              "[remat::OffloadSavedTensors] activation offload (gradient_checkpointing_offload_attention) "
              "needs LibTorch's own autograd engine, and this process runs another one (PyTorch's Python "
              "engine when remat is loaded into Python); use torch.autograd.graph.saved_tensors_hooks there");
}

}  // namespace

OffloadSavedTensors::OffloadSavedTensors(const std::optional<SavedTensorOffload>& offload) {
  if (!offload && t_scope == nullptr) return;  // nothing to switch off
  if (offload) install_offload_engine();
  auto* scope = new Scope();
  if (offload) {
    scope->group = std::make_shared<SavedGroup>();
    scope->group->options = *offload;
    scope->group->previous = t_last_filled;
  }
  outer_ = t_scope;
  scope_ = scope;
  t_scope = scope;
}

OffloadSavedTensors::~OffloadSavedTensors() {
  if (scope_ == nullptr) return;
  t_scope = outer_;
  delete scope_;
}

namespace detail {

SuppressSavedTensorOffload::SuppressSavedTensorOffload() { ++t_suppressed; }
SuppressSavedTensorOffload::~SuppressSavedTensorOffload() { --t_suppressed; }

}  // namespace detail

SavedTensorOffloadStats saved_tensor_offload_stats() {
  SavedTensorOffloadStats stats;
  stats.tensors_offloaded = g_counters.tensors_offloaded;
  stats.tensors_kept = g_counters.tensors_kept;
  stats.tensors_restored = g_counters.tensors_restored;
  stats.bytes_to_host = g_counters.bytes_to_host;
  stats.bytes_to_device = g_counters.bytes_to_device;
  stats.prefetched = g_counters.prefetched;
  return stats;
}

void reset_saved_tensor_offload_stats() {
  g_counters.tensors_offloaded = 0;
  g_counters.tensors_kept = 0;
  g_counters.tensors_restored = 0;
  g_counters.bytes_to_host = 0;
  g_counters.bytes_to_device = 0;
  g_counters.prefetched = 0;
}

}  // namespace remat
