#pragma once
// Private helpers shared by step.cpp, auto_layout.cpp and benchmark.cpp.

#include <optional>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "detail/rng_autocast.h"

namespace remat::train {

/// The current autocast state with `dtype` enabled on `device`'s type (unchanged when nullopt).
detail::AutocastSnapshot autocast_snapshot(const std::optional<at::ScalarType>& dtype,
                                           const c10::Device& device);

}  // namespace remat::train
