#include "detail/rng.h"

#include <algorithm>
#include <mutex>

#include <ATen/Context.h>


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

}  // namespace remat::detail
