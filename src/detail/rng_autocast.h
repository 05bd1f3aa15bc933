#pragma once
// State of the forward pass that recomputation must see again: random generators and autocast.

#include <vector>

#include <ATen/ATen.h>

#include "remat/checkpoint.h"

namespace remat::detail {

/// Generator states of the CPU generator and of the default generators of `devices`.
class RngSnapshot {
 public:
  /// Captures the current states. `tensors` decides which non-CPU devices are involved.
  static RngSnapshot capture(const Tensors& tensors);
  /// Sets the generators to the captured states.
  void restore() const;
  bool empty() const { return states_.empty(); }

 private:
  friend class RngFork;
  std::vector<std::pair<at::Device, at::Tensor>> states_;
};

/// RAII: sets the generators to `snapshot` and, on destruction, back to what they were, so that
/// recomputation replays the forward random numbers without disturbing the caller's stream.
class RngFork {
 public:
  explicit RngFork(const RngSnapshot& snapshot);
  ~RngFork();
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngSnapshot saved_;
};

/// Autocast (mixed precision) state for CPU and CUDA.
struct AutocastSnapshot {
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  bool cuda_enabled = false;
  at::ScalarType cuda_dtype = at::kHalf;
  bool cache_enabled = true;

  static AutocastSnapshot capture();
  bool any_enabled() const { return cpu_enabled || cuda_enabled; }
};

/// RAII: applies `snapshot` for the lifetime of the guard and restores the previous state. Like
/// Python's torch.autocast, it clears the cast cache when the outermost autocast region ends, so
/// recomputation in a backward thread does not leave cast copies of the weights behind.
class AutocastGuard {
 public:
  explicit AutocastGuard(const AutocastSnapshot& snapshot);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastSnapshot previous_;
  bool nested_ = false;
};

}  // namespace remat::detail
