#pragma once
// Random-generator state of the forward pass, which recomputation must see again (autocast state:
// remat/autocast.h).

#include <vector>

#include <ATen/ATen.h>

#include "remat/autocast.h"
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

}  // namespace remat::detail
