#pragma once
/// \file
/// Learning-rate schedules, pure functions of the step, as SimpleTuner computes them
/// (helpers/training/custom_schedule.py, get_lr_scheduler).

#include <cstdint>
#include <string>
#include <vector>

#include "remat/export.h"

namespace remat::train {

/// The lr_scheduler choices, as SimpleTuner computes them (single process).
enum class LrScheduler {
  Constant,            ///< lr everywhere
  ConstantWithWarmup,  ///< linear warmup from 0 over warmup_steps, then lr
  Linear,              ///< linear warmup, then linear decay to 0 at total_steps
  Polynomial,          ///< linear warmup, then (lr - lr_end) * remaining^power + lr_end
  Cosine,              ///< raised cosine between lr and lr_end, half-period warmup_steps
  Sine,                ///< sine wave between lr_end and lr, half-period warmup_steps
  CosineWithRestarts,  ///< SimpleTuner's CosineAnnealingHardRestarts: stays at lr (see lr_at_step)
};

/// The lr_scheduler names in the order docs list them: constant, constant_with_warmup, linear,
/// polynomial, cosine, sine, cosine_with_restarts.
REMAT_API const std::vector<std::string>& lr_scheduler_names();

/// Parses one of lr_scheduler_names(), or cosine_with_warmup (SimpleTuner's alias of cosine);
/// throws ValidationError otherwise.
REMAT_API LrScheduler parse_lr_scheduler(const std::string& name);

/// A learning-rate schedule: SimpleTuner's get_lr_scheduler inputs.
struct LrSchedule {
  LrScheduler kind = LrScheduler::Constant;
  double learning_rate = 0.0;  ///< the base (peak) learning rate
  int64_t warmup_steps = 0;    ///< >= 0: the warmup of the LambdaLR schedules, the period of the others
  int64_t total_steps = 1;     ///< >= 1: the end of Linear and Polynomial
  double lr_end = 4e-7;        ///< the floor of Cosine and Sine, the end of Polynomial
  double power = 0.8;          ///< Polynomial's exponent
};

/// The learning rate for optimizer step `step` (0-based: the number of optimizer steps already
/// taken, as PyTorch schedulers count them, so with warmup the first update uses lr 0). With
/// w = warmup_steps, T = total_steps, e = lr_end:
///  - Constant: lr.
///  - ConstantWithWarmup: lr * step / max(1, w) while step < w, then lr (diffusers).
///  - Linear: the same warmup, then lr * max(0, (T - step) / max(1, T - w)) (diffusers).
///  - Polynomial: the same warmup; then for step <= T, (lr - e) * (1 - (step - w) / max(1, T - w))^power + e;
///    after T, e (SimpleTuner's get_polynomial_decay_schedule_with_warmup).
///  - Cosine: e + (lr - e) * (1 + cos(pi * step / P)) / 2 with P = w, or 1000 when w is 0: a
///    periodic raised cosine without warmup (SimpleTuner's Cosine scheduler with its default
///    steps_per_epoch of -1, which makes the phase -step).
///  - Sine: e + (lr - e) * (1 + sin(pi * step / w)) / 2, starting half-way (SimpleTuner's Sine).
///  - CosineWithRestarts: lr (SimpleTuner's CosineAnnealingHardRestarts keeps its phase at
///    step % -1 = 0, so the rate never moves).
/// Cosine, Sine and CosineWithRestarts are floored to a multiple of 1e-9, as SimpleTuner writes
/// them. Throws ValidationError for step < 0, warmup < 0, total < 1, Sine or CosineWithRestarts
/// with warmup 0, or Polynomial with lr <= lr_end.
REMAT_API double lr_at_step(const LrSchedule& schedule, int64_t step);

}  // namespace remat::train
