#include "remat/checkpoint.h"

#include <stdexcept>

#include <torch/csrc/autograd/grad_mode.h>

#include "detail/checkpoint_node.h"

namespace remat {

std::string backend_name(Backend backend) {
  switch (backend) {
    case Backend::Recompute:
      return "torch";
    case Backend::Offload:
      return "unsloth";
  }
  return "unknown";
}

Backend parse_backend(const std::string& name) {
  if (name == "torch") return Backend::Recompute;
  if (name == "unsloth") return Backend::Offload;
  throw std::invalid_argument("[checkpoint] backend must be one of torch, unsloth, got '" + name + "'");
}

Tensors checkpoint(const SegmentFn& fn, const Tensors& inputs, const CheckpointOptions& options) {
  if (!fn) throw std::invalid_argument("[checkpoint] fn must be callable, got an empty function");
  if (!torch::autograd::GradMode::is_enabled()) return fn(inputs);
  return detail::checkpoint_with_graph_surgery(fn, inputs, options);
}

}  // namespace remat
