#pragma once
// Used only where the LibTorch install lacks torch/csrc/distributed/autograd (Debian's
// libtorch-dev ships c10d's headers but not these; PyTorch's own installs have them).
// c10d/reducer.hpp includes this header for two names and nothing else: the type of a pointer
// member it never exposes (ContextPtr) and, in a static_assert, the gradient callback's
// signature. Both are declared here exactly as PyTorch's context.h declares them; remat never
// creates, reads or destroys a distributed-autograd context.
#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>

namespace torch {
namespace distributed {
namespace autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};
using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace autograd
}  // namespace distributed
}  // namespace torch
