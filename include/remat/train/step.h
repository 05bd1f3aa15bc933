#pragma once
/// \file
/// One training step (forward with the flow-matching loss, backward, optimizer step) with its
/// timings and tracked peak, as `remat bench` runs it and as the auto-layout profile measures it.

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "remat/export.h"
#include "remat/train/data.h"
#include "remat/train/transformer.h"

namespace remat::train {

/// How a step runs besides the model and data.
struct StepSettings {
  FlowMatchingOptions flow;
  /// Autocast dtype for the forward pass (bf16 mixed precision on the model's device); nullopt:
  /// no autocast.
  std::optional<at::ScalarType> autocast;
};

/// What one step took. Times in seconds, the device synchronised at each boundary.
struct StepMeasurement {
  double step_s = 0.0;
  double forward_s = 0.0;    ///< from the step's start to the loss (noise, sigmas, forward, loss)
  double backward_s = 0.0;
  double optimizer_s = 0.0;
  /// memory::peak_bytes(device) over the step after a reset at its start: absolute, parameters,
  /// gradients and optimizer state included (torch.cuda.max_memory_allocated's figure on CUDA).
  int64_t peak_bytes = 0;
  double loss = 0.0;
};

/// Runs one step: gradients of `parameters` set to none, peak reset, loss =
/// model.flow_matching_loss(batch) (under autocast when set), backward, optimizer.step(), and the
/// gradients freed again (as remat's trainer does between steps). `batch` must be on the model's
/// device; `generator` supplies noise and sigmas. No gradient clipping.
REMAT_API StepMeasurement run_training_step(Transformer& model, torch::optim::Optimizer& optimizer,
                                            const std::vector<at::Tensor>& parameters,
                                            const Batch& batch, const StepSettings& settings,
                                            at::Generator& generator);

/// Waits for the work queued on `device` (no-op on CPU).
REMAT_API void synchronize_device(const c10::Device& device);

}  // namespace remat::train
