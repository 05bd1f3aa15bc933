#pragma once
/// \file
/// Activation offload without recomputation: while an `OffloadSavedTensors` scope is open on a
/// thread, the tensors autograd saves for backward go to host memory and come back when backward
/// unpacks them. SimpleTuner's `gradient_checkpointing_offload_attention` wraps the attention half
/// of every block in such a scope (activation_offload_context in
/// simpletuner/helpers/training/offloaded_gradient_checkpointer.py, opened around `self.attn(...)`
/// in FluxTransformerBlock.forward, simpletuner/helpers/models/flux/transformer.py); remat's Flux
/// and MageFlow blocks do the same after `set_attention_offload`.
///
/// What moves: tensors autograd saves that an op recorded in the scope produced (non-leaf tensors,
/// SimpleTuner's rule: parameters and other leaves stay where they are). A tensor on an
/// accelerator is copied on remat's copy stream into a host buffer (pinned, from the capped pool
/// below) and its device memory is given back at once; backward copies it back on the copy
/// stream when it needs it, the compute stream waiting for the copy ("just in time"), or ahead of
/// time with `prefetch`. A checkpoint's forward pass, whose graph is dropped, offloads nothing. A
/// CPU tensor is copied into host memory outside remat's CPU tracking, so that the tracked bytes
/// of a CPU run show what a GPU would hold (as remat/weight_stream.h does); on CPU this saves
/// nothing real.
///
/// Prefetch is a static schedule, not learned at run time: backward runs blocks in reverse order,
/// so when backward first unpacks a tensor of one scope, the tensors of the last scope before it
/// on the same thread that offloaded anything start their copy back (one offloading scope ahead,
/// on the copy stream). Scopes opened while a checkpoint recomputes bring theirs back just in
/// time: the scope backward needs next has not been recomputed yet.
///
/// The hooks are LibTorch's SavedVariableHooks. LibTorch offers default saved-tensor hooks to
/// Python only (at::SavedTensorDefaultHooks holds Python objects), so remat installs, on first
/// use, an autograd engine that differs from LibTorch's own only in handing out these hooks while
/// a scope is open (Engine::get_default_saved_variable_hooks, torch/csrc/autograd/engine.h). A
/// process that already runs another engine (PyTorch's Python engine, when remat is loaded into
/// Python) gets a clear error instead.
///
/// Host buffers: every activation offload (these scopes and the "unsloth" checkpoint backend)
/// takes its host buffers from one pool of *buckets*, one per tensor shape (element count and
/// dtype), each a free list of pinned buffers reused step after step. At most
/// `max_buckets` shapes get buckets (SimpleTuner's
/// `gradient_checkpointing_offload_pin_memory_max_buckets`, default 12; 0: no pinned buffers);
/// a shape beyond the cap uses pageable host memory for that tensor.

#include <cstdint>
#include <optional>

#include "remat/export.h"

namespace remat {

/// How a scope offloads.
struct SavedTensorOffload {
  /// Copy the tensors of the last scope before this one that offloaded anything back to the
  /// device ahead of time, when backward first unpacks a tensor of this one (SimpleTuner's
  /// `gradient_checkpointing_offload_prefetch`, here a static schedule).
  bool prefetch = false;
};

/// While alive, tensors autograd saves on this thread move to host memory (see the file comment).
/// `offload` unset: the scope does nothing, so callers can write one code path. Scopes nest; the
/// innermost decides. Throws c10::Error when this process runs an autograd engine other than
/// LibTorch's own.
class REMAT_API OffloadSavedTensors {
 public:
  explicit OffloadSavedTensors(const std::optional<SavedTensorOffload>& offload);
  ~OffloadSavedTensors();
  OffloadSavedTensors(const OffloadSavedTensors&) = delete;
  OffloadSavedTensors& operator=(const OffloadSavedTensors&) = delete;

  struct Scope;  // opaque: what the thread's innermost scope offloads into

 private:
  Scope* scope_ = nullptr;
  Scope* outer_ = nullptr;
};

/// Counters of the saved-tensor offload since the last reset, for logs and tests.
struct SavedTensorOffloadStats {
  int64_t tensors_offloaded = 0;  ///< tensors copied to host memory
  int64_t tensors_kept = 0;       ///< leaves saved in a scope and left where they were
  int64_t tensors_restored = 0;   ///< offloaded tensors handed back to backward
  int64_t bytes_to_host = 0;
  int64_t bytes_to_device = 0;
  int64_t prefetched = 0;         ///< tensors copied back ahead of their use
};
REMAT_API SavedTensorOffloadStats saved_tensor_offload_stats();
REMAT_API void reset_saved_tensor_offload_stats();

/// The default cap of the host buffer pool (SimpleTuner's default).
constexpr int64_t kDefaultOffloadPinMemoryMaxBuckets = 12;

/// Sets the cap on the number of shapes with pooled pinned buffers; a lower cap drops the idle
/// buffers of the buckets beyond it (the most recently admitted shapes go first). Throws
/// c10::ValueError for a negative value.
REMAT_API void set_offload_pin_memory_max_buckets(int64_t max_buckets);
REMAT_API int64_t offload_pin_memory_max_buckets();

/// Counters of the host buffer pool since the last reset.
struct OffloadPoolStats {
  int64_t buckets = 0;           ///< shapes with a bucket now
  int64_t checkouts = 0;         ///< buffers handed out
  int64_t pooled_checkouts = 0;  ///< of which from a bucket (pinned for an accelerator)
  int64_t reuses = 0;            ///< of which a buffer given back earlier
  int64_t cap_misses = 0;        ///< pageable buffers handed out because the cap was reached
  int64_t idle_buffers = 0;      ///< buffers waiting in buckets now
  int64_t pooled_bytes = 0;      ///< bytes of every pooled buffer now, idle or in use
};
REMAT_API OffloadPoolStats offload_pool_stats();
/// Zeroes the counters (buckets, idle buffers and pooled bytes describe the pool and stay).
REMAT_API void reset_offload_pool_stats();
/// Frees every idle pooled buffer and forgets the buckets that have none in use.
REMAT_API void release_offload_pool();

}  // namespace remat
