#pragma once
/// \file
/// The autocast (mixed precision) state of CPU and CUDA as a value: captured in the forward pass,
/// applied again during recomputation, and used by the training step to run a forward pass under
/// bf16 autocast. LibTorch 1.13 and 2.x spell this API differently; remat/compat.h hides that.

#include <optional>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "remat/export.h"

namespace remat {

/// Autocast (mixed precision) state for CPU and CUDA.
struct REMAT_API AutocastSnapshot {
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  bool cuda_enabled = false;
  at::ScalarType cuda_dtype = at::kHalf;
  bool cache_enabled = true;

  /// The current state.
  static AutocastSnapshot capture();
  /// The current state with autocast to `dtype` enabled on `device`'s type (unchanged when
  /// nullopt).
  static AutocastSnapshot with(const std::optional<at::ScalarType>& dtype, const c10::Device& device);
  bool any_enabled() const { return cpu_enabled || cuda_enabled; }
};

/// RAII: applies `snapshot` for the lifetime of the guard and restores the previous state. Like
/// Python's torch.autocast, it clears the cast cache when the outermost autocast region ends, so
/// recomputation in a backward thread does not leave cast copies of the weights behind.
class REMAT_API AutocastGuard {
 public:
  explicit AutocastGuard(const AutocastSnapshot& snapshot);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastSnapshot previous_;
  bool nested_ = false;
};

}  // namespace remat
