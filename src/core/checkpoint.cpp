#include "remat/checkpoint.h"
#include "remat/util/error.h"
#include "remat/saved_inputs.h"

#include <stdexcept>

#include <torch/csrc/autograd/grad_mode.h>

#include "detail/checkpoint_node.h"

namespace remat {

std::string backend_name(Backend backend) { return saved_input_policy(backend).name(); }

Backend parse_backend(const std::string& name) { return saved_input_policy(name).backend(); }

Tensors checkpoint(const SegmentFn& fn, const Tensors& inputs, const CheckpointOptions& options) {
  if (!fn) throw_value_error("[checkpoint] fn must be callable, got an empty function");
  if (!torch::autograd::GradMode::is_enabled()) return fn(inputs);
  return detail::checkpoint_with_graph_surgery(fn, inputs, options);
}

}  // namespace remat
