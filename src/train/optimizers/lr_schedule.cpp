// Learning-rate schedules (remat/train/optimizers/lr_schedule.h), SimpleTuner's
// (helpers/training/custom_schedule.py get_lr_scheduler): constant, constant_with_warmup and linear
// are diffusers.optimization's; polynomial, cosine, sine and cosine_with_restarts are SimpleTuner's
// own classes, computed here as closed forms of what they do when stepped once per optimizer step
// from a fresh start.
#include "remat/train/optimizers/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "remat/train/options/config.h"

namespace remat::train {

constexpr double kPi = 3.14159265358979323846;

const std::vector<std::string>& lr_scheduler_names() {
  static const std::vector<std::string> names = {"constant", "constant_with_warmup", "linear", "polynomial",
                                                 "cosine", "sine", "cosine_with_restarts"};
  return names;
}

LrScheduler parse_lr_scheduler(const std::string& name) {
  if (name == "constant") return LrScheduler::Constant;
  if (name == "constant_with_warmup") return LrScheduler::ConstantWithWarmup;
  if (name == "linear") return LrScheduler::Linear;
  if (name == "polynomial") return LrScheduler::Polynomial;
  if (name == "cosine" || name == "cosine_with_warmup") return LrScheduler::Cosine;
  if (name == "sine") return LrScheduler::Sine;
  if (name == "cosine_with_restarts") return LrScheduler::CosineWithRestarts;
  std::string valid;
  for (const auto& n : lr_scheduler_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw ValidationError("lr_scheduler", name,
                        "[train] lr_scheduler must be one of " + valid + " (or cosine_with_warmup), got '" +
                            name + "'");
}

namespace {

// SimpleTuner's custom schedulers write math.floor(lr * 1e9) / 1e9 into the optimizer.
double floor_to_nano(double lr) { return std::floor(lr * 1e9) / 1e9; }

}  // namespace

double lr_at_step(const LrSchedule& s, int64_t step) {
  if (step < 0) {
    throw ValidationError("step", std::to_string(step),
                          "[lr_at_step] step must be >= 0, got " + std::to_string(step));
  }
  if (s.warmup_steps < 0) {
    throw ValidationError("lr_warmup_steps", std::to_string(s.warmup_steps),
                          "[lr_at_step] lr_warmup_steps must be >= 0, got " + std::to_string(s.warmup_steps));
  }
  if (s.total_steps < 1) {
    throw ValidationError("max_train_steps", std::to_string(s.total_steps),
                          "[lr_at_step] total_steps must be >= 1, got " + std::to_string(s.total_steps));
  }
  const double lr = s.learning_rate, end = s.lr_end;
  const double k = static_cast<double>(step), w = static_cast<double>(s.warmup_steps);
  const double T = static_cast<double>(s.total_steps);
  switch (s.kind) {
    case LrScheduler::Constant:
      return lr;
    case LrScheduler::CosineWithRestarts:
      if (s.warmup_steps < 1) {
        throw ValidationError("lr_warmup_steps", "0",
                              "[train] lr_warmup_steps must be >= 1 with lr_scheduler cosine_with_restarts "
                              "(its period), got 0");
      }
      return floor_to_nano(lr);
    case LrScheduler::Cosine: {
      const double period = s.warmup_steps > 0 ? w : 1000.0;
      return floor_to_nano(end + (lr - end) * (1.0 + std::cos(kPi * k / period)) / 2.0);
    }
    case LrScheduler::Sine:
      if (s.warmup_steps < 1) {
        throw ValidationError("lr_warmup_steps", "0",
                              "[train] lr_warmup_steps must be >= 1 with lr_scheduler sine (its period), got 0");
      }
      return floor_to_nano(end + (lr - end) * 0.5 * (1.0 + std::sin(kPi * k / w)));
    default:
      break;
  }
  if (s.kind == LrScheduler::Polynomial && !(lr > end)) {
    throw ValidationError("lr_end", std::to_string(end),
                          "[train] lr_end must be below learning_rate (" + std::to_string(lr) +
                              ") with lr_scheduler polynomial, got " + std::to_string(end));
  }
  // The warmup of the LambdaLR schedules.
  if (step < s.warmup_steps) return lr * k / std::max(1.0, w);
  switch (s.kind) {
    case LrScheduler::ConstantWithWarmup:
      return lr;
    case LrScheduler::Linear:
      return lr * std::max(0.0, (T - k) / std::max(1.0, T - w));
    case LrScheduler::Polynomial: {
      if (k > T) return end;
      const double remaining = 1.0 - (k - w) / std::max(1.0, T - w);
      return (lr - end) * std::pow(remaining, s.power) + end;
    }
    default:
      return lr;
  }
}

}  // namespace remat::train
