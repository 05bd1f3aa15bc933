#include "remat/models/checkpointing.h"
#include "remat/util/error.h"

#include <algorithm>
#include <stdexcept>

namespace remat::models {

Tensors run_block_part(const SegmentFn& part, const Tensors& inputs, std::optional<Backend> backend) {
  if (!backend) return part(inputs);
  CheckpointOptions options;
  options.backend = *backend;
  return remat::checkpoint(part, inputs, options);
}

}  // namespace remat::models
