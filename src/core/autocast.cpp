// Saving and applying the autocast (mixed precision) state; the version differences are in
// remat/compat.h.
#include "remat/autocast.h"

#include <ATen/autocast_mode.h>

#include "remat/compat.h"

namespace remat {

AutocastSnapshot AutocastSnapshot::capture() {
  AutocastSnapshot s;
  s.cpu_enabled = compat::autocast_enabled(c10::DeviceType::CPU);
  s.cpu_dtype = compat::autocast_dtype(c10::DeviceType::CPU);
  s.cuda_enabled = compat::autocast_enabled(c10::DeviceType::CUDA);
  s.cuda_dtype = compat::autocast_dtype(c10::DeviceType::CUDA);
  s.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

namespace {
void apply(const AutocastSnapshot& s) {
  compat::set_autocast_enabled(c10::DeviceType::CPU, s.cpu_enabled);
  compat::set_autocast_dtype(c10::DeviceType::CPU, s.cpu_dtype);
  compat::set_autocast_enabled(c10::DeviceType::CUDA, s.cuda_enabled);
  compat::set_autocast_dtype(c10::DeviceType::CUDA, s.cuda_dtype);
  at::autocast::set_autocast_cache_enabled(s.cache_enabled);
}
}  // namespace

AutocastGuard::AutocastGuard(const AutocastSnapshot& snapshot)
    : previous_(AutocastSnapshot::capture()) {
  apply(snapshot);
  if (snapshot.any_enabled()) {
    at::autocast::increment_nesting();
    nested_ = true;
  }
}

AutocastGuard::~AutocastGuard() {
  if (nested_ && at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  apply(previous_);
}

AutocastSnapshot AutocastSnapshot::with(const std::optional<at::ScalarType>& dtype,
                                        const c10::Device& device) {
  AutocastSnapshot s = capture();
  if (dtype) {
    if (device.is_cuda()) {
      s.cuda_enabled = true;
      s.cuda_dtype = *dtype;
    } else {
      s.cpu_enabled = true;
      s.cpu_dtype = *dtype;
    }
  }
  return s;
}

}  // namespace remat
