#pragma once
/// \file
/// GlobalGeneratorGuard: the global CPU generator's state is saved when the guard is made and put
/// back when it goes. Building a module initialises its parameters from that generator before
/// loaded weights replace them, so a run that loads an encoder (a cold cache, a validation pass)
/// would otherwise draw different noise afterwards than a run that does not (a warm cache, no
/// validation); under the guard both train the same bits.

#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>

namespace remat {

class GlobalGeneratorGuard {
 public:
  GlobalGeneratorGuard() : state_(at::detail::getDefaultCPUGenerator().get_state()) {}
  ~GlobalGeneratorGuard() {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state_);
  }
  GlobalGeneratorGuard(const GlobalGeneratorGuard&) = delete;
  GlobalGeneratorGuard& operator=(const GlobalGeneratorGuard&) = delete;

 private:
  at::Tensor state_;
};

}  // namespace remat
