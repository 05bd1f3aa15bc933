#pragma once
/// \file
/// GlobalGeneratorGuard: the global CPU generator's state (and, when asked, a device's default
/// generator's) is saved when the guard is made and put back when it goes, exceptions included.
/// Building a module initialises its parameters from the CPU generator before loaded weights
/// replace them, so a run that loads an encoder (a cold cache, a validation pass) would otherwise
/// draw different noise afterwards than a run that does not (a warm cache, no validation); under
/// the guard both train the same bits. A step profile (remat/train/memory/auto_layout.h) draws on
/// the device's generator too (an optimizer's scratch step), and must not change the run either.

#include <mutex>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>

namespace remat {

class GlobalGeneratorGuard {
 public:
  /// Saves the CPU generator, and `device`'s default generator when `device` is not the CPU.
  explicit GlobalGeneratorGuard(c10::optional<c10::Device> device = c10::nullopt) {
    save(at::detail::getDefaultCPUGenerator());
    if (device && !device->is_cpu()) save(at::globalContext().defaultGenerator(*device));
  }
  ~GlobalGeneratorGuard() {
    for (auto& [generator, state] : saved_) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state);
    }
  }
  GlobalGeneratorGuard(const GlobalGeneratorGuard&) = delete;
  GlobalGeneratorGuard& operator=(const GlobalGeneratorGuard&) = delete;

 private:
  void save(at::Generator generator) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    at::Tensor state = generator.get_state();
    saved_.emplace_back(std::move(generator), std::move(state));
  }

  std::vector<std::pair<at::Generator, at::Tensor>> saved_;
};

}  // namespace remat
