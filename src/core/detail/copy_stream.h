#pragma once
// The side stream remat's host <-> device copies run on (offloaded checkpoint inputs, streamed
// weights), one per device, so that copies are ordered among themselves and overlap computation.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace remat::detail {

/// The copy stream of `device` (a concrete, indexed non-CPU device), created on first use from
/// the device's stream pool.
c10::Stream copy_stream(const at::Device& device);

/// `device` with its index filled in (a device without an index means the current one; streams
/// need the concrete index).
at::Device resolved_device(const at::Device& device);

}  // namespace remat::detail
