#include "detail/rng_autocast.h"

#include <algorithm>
#include <mutex>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "remat/compat.h"

namespace remat::detail {
namespace {

at::Generator generator_for(const at::Device& device) {
  return at::globalContext().defaultGenerator(device);
}

}  // namespace

RngSnapshot RngSnapshot::capture(const Tensors& tensors) {
  RngSnapshot snapshot;
  std::vector<at::Device> devices{at::Device(at::kCPU)};
  for (const auto& t : tensors) {
    if (!t.defined() || t.device().is_cpu()) continue;
    // Generators are per device index; an index-less device means the current one.
    at::Device device = t.device();
    if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
      devices.push_back(device);
    }
  }
  for (const auto& device : devices) {
    auto generator = generator_for(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    snapshot.states_.emplace_back(device, generator.get_state());
  }
  return snapshot;
}

void RngSnapshot::restore() const {
  for (const auto& [device, state] : states_) {
    auto generator = generator_for(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
}

RngFork::RngFork(const RngSnapshot& snapshot) {
  // Save the current states of the same generators, then switch to the snapshot.
  saved_ = snapshot;
  for (auto& [device, state] : saved_.states_) {
    auto generator = generator_for(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  snapshot.restore();
}

RngFork::~RngFork() { saved_.restore(); }

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

}  // namespace remat::detail
