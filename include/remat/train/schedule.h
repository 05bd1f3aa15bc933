#pragma once
/// \file
/// Learning-rate schedules (pure functions of the step) and flow-matching sigma helpers used by
/// `remat train`.

#include <cstdint>
#include <string>

#include <ATen/Tensor.h>
#include <ATen/core/Generator.h>

#include "remat/export.h"

namespace remat::train {

/// The lr_scheduler choices.
enum class LrScheduler {
  Constant,            ///< lr everywhere
  ConstantWithWarmup,  ///< linear warmup from 0 over warmup_steps, then lr
  Cosine,              ///< linear warmup, then half a cosine from lr down to 0 at total_steps
};

/// Parses "constant", "constant_with_warmup" or "cosine"; throws ValidationError otherwise.
REMAT_API LrScheduler parse_lr_scheduler(const std::string& name);

/// A learning-rate schedule: the parameters of diffusers' get_*_schedule functions.
struct LrSchedule {
  LrScheduler kind = LrScheduler::Constant;
  double learning_rate = 0.0;  ///< peak learning rate (> 0 not required; 0 gives 0 everywhere)
  int64_t warmup_steps = 0;    ///< >= 0
  int64_t total_steps = 1;     ///< >= 1; used by Cosine only
  double num_cycles = 0.5;     ///< cosine waves over the decay; 0.5 = one half-wave down to 0
};

/// The learning rate for optimizer step `step` (0-based: the number of optimizer steps already
/// taken, as diffusers' LambdaLR counts them, so with warmup the first update uses lr 0):
///  - Constant: lr.
///  - ConstantWithWarmup: lr * step / max(1, warmup) while step < warmup, then lr.
///  - Cosine: the same warmup, then with p = (step - warmup) / max(1, total - warmup),
///    lr * max(0, 0.5 * (1 + cos(pi * num_cycles * 2 * p))).
/// Throws ValidationError for step < 0, warmup < 0 or total < 1.
REMAT_API double lr_at_step(const LrSchedule& schedule, int64_t step);

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
