#pragma once
/// \file
/// The flow-matching training objective's sigmas, shared by the families: the timestep shift and
/// how training sigmas are drawn.

#include <cstdint>

#include <ATen/Tensor.h>
#include <ATen/core/Generator.h>

#include "remat/export.h"

namespace remat::train {

/// The flow-matching timestep shift (SD3 paper §5.3.2, as SimpleTuner's apply_flow_schedule_shift
/// and diffusers' FlowMatchEulerDiscreteScheduler apply it): shift * s / (1 + (shift - 1) * s).
/// shift > 1 moves sigmas towards 1 (more noise). Throws ValidationError for shift <= 0.
REMAT_API double shift_sigma(double sigma, double shift);

/// shift_sigma applied elementwise to a floating tensor of any shape, in its dtype.
REMAT_API at::Tensor shift_sigmas(const at::Tensor& sigmas, double shift);

/// How training sigmas are drawn.
enum class SigmaSampling {
  /// sigmoid(scale * n), n ~ N(0, 1): a logit-normal distribution. SimpleTuner's default for
  /// flow-matching models (Flux included) when no other flow schedule flag is set.
  LogitNormal,
  /// u ~ U[0, 1) (SimpleTuner's --flow_use_uniform_schedule).
  Uniform,
};

/// Draws `batch` training sigmas from `generator` (its device decides where), then applies the
/// flow shift when `shift` > 0 (shift 0 means no shift, as in SimpleTuner). Returns a (B,) float32
/// tensor in [0, 1]. Timesteps for the model are sigma * 1000. Throws ValidationError for
/// batch < 1, sigmoid_scale <= 0 or shift < 0.
REMAT_API at::Tensor sample_sigmas(int64_t batch, SigmaSampling sampling, double sigmoid_scale,
                                   double shift, at::Generator generator);

}  // namespace remat::train
