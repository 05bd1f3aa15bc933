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
  /// Clip the global gradient L2 norm to this before the optimizer step; 0: no clipping.
  double max_grad_norm = 0.0;
  /// Compute the gradient norm even without clipping (for reporting).
  bool measure_grad_norm = false;
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
  double loss = 0.0;          ///< mean over the micro-batches
  double grad_norm = 0.0;     ///< before clipping; 0 unless clipped or measure_grad_norm
};

/// Runs one optimizer step over `micro_batches` (gradient accumulation: each loss scaled by
/// 1/n): gradients of `parameters` set to none, peak reset, for each micro-batch loss =
/// model.flow_matching_loss(batch) (under autocast when set) and backward, clipping when
/// settings.max_grad_norm > 0, optimizer.step(), and the gradients freed again. The batches must
/// be on the model's device; `generator` supplies noise and sigmas, in batch order. This is the
/// step of `remat train`, `remat bench` and the auto-layout profile.
REMAT_API StepMeasurement run_training_step(Transformer& model, torch::optim::Optimizer& optimizer,
                                            const std::vector<at::Tensor>& parameters,
                                            const std::vector<Batch>& micro_batches,
                                            const StepSettings& settings, at::Generator& generator);

/// The same for one batch.
REMAT_API StepMeasurement run_training_step(Transformer& model, torch::optim::Optimizer& optimizer,
                                            const std::vector<at::Tensor>& parameters,
                                            const Batch& batch, const StepSettings& settings,
                                            at::Generator& generator);

/// Waits for the work queued on `device` (no-op on CPU).
REMAT_API void synchronize_device(const c10::Device& device);

}  // namespace remat::train
