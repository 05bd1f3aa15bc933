// Learning-rate schedules and flow-matching sigma helpers.
//
// The schedules are SimpleTuner's (helpers/training/custom_schedule.py get_lr_scheduler):
// constant, constant_with_warmup and linear are diffusers.optimization's; polynomial, cosine, sine
// and cosine_with_restarts are SimpleTuner's own classes, computed here as closed forms of what
// they do when stepped once per optimizer step from a fresh start. The shift is SimpleTuner's apply_flow_schedule_shift (SD3 paper §5.3.2); the sigma
// sampling is SimpleTuner's ModelFoundation.sample_flow_sigmas default (sigmoid of a scaled normal)
// and its --flow_use_uniform_schedule branch.
#include "remat/train/schedule.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "remat/train/config.h"

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

double shift_sigma(double sigma, double shift) {
  if (!(shift > 0)) {
    throw ValidationError("flow_schedule_shift", std::to_string(shift),
                          "[shift_sigma] shift must be > 0, got " + std::to_string(shift));
  }
  return shift * sigma / (1.0 + (shift - 1.0) * sigma);
}

at::Tensor shift_sigmas(const at::Tensor& sigmas, double shift) {
  if (!(shift > 0)) {
    throw ValidationError("flow_schedule_shift", std::to_string(shift),
                          "[shift_sigmas] shift must be > 0, got " + std::to_string(shift));
  }
  TORCH_CHECK_VALUE(sigmas.is_floating_point(), "[shift_sigmas] sigmas must be a floating tensor, got ",
                    sigmas.scalar_type());
  return sigmas * shift / (sigmas * (shift - 1.0) + 1.0);
}

at::Tensor sample_sigmas(int64_t batch, SigmaSampling sampling, double sigmoid_scale, double shift,
                         at::Generator generator) {
  if (batch < 1) {
    throw ValidationError("train_batch_size", std::to_string(batch),
                          "[sample_sigmas] batch must be >= 1, got " + std::to_string(batch));
  }
  if (!(sigmoid_scale > 0)) {
    throw ValidationError("flow_sigmoid_scale", std::to_string(sigmoid_scale),
                          "[sample_sigmas] flow_sigmoid_scale must be > 0, got " + std::to_string(sigmoid_scale));
  }
  if (!(shift >= 0)) {
    throw ValidationError("flow_schedule_shift", std::to_string(shift),
                          "[sample_sigmas] flow_schedule_shift must be >= 0 (0 = no shift), got " +
                              std::to_string(shift));
  }
  TORCH_CHECK_VALUE(generator.defined(), "[sample_sigmas] generator must be defined");
  const auto options = at::TensorOptions().dtype(at::kFloat).device(generator.device());
  at::Tensor sigmas = sampling == SigmaSampling::Uniform
                          ? at::rand({batch}, generator, options)
                          : at::sigmoid(at::randn({batch}, generator, options) * sigmoid_scale);
  // SimpleTuner applies the static shift only when it is > 0.
  if (shift > 0) sigmas = shift_sigmas(sigmas, shift);
  return sigmas;
}

}  // namespace remat::train
