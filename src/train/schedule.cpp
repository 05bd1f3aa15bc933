// Learning-rate schedules and flow-matching sigma helpers.
//
// The schedules follow diffusers.optimization (get_constant_schedule,
// get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup), which SimpleTuner uses for
// these names. The shift is SimpleTuner's apply_flow_schedule_shift (SD3 paper §5.3.2); the sigma
// sampling is SimpleTuner's ModelFoundation.sample_flow_sigmas default (sigmoid of a scaled normal)
// and its --flow_use_uniform_schedule branch.
#include "remat/train/schedule.h"

#include <cmath>

#include <ATen/ATen.h>

#include "remat/train/config.h"

namespace remat::train {

constexpr double kPi = 3.14159265358979323846;

LrScheduler parse_lr_scheduler(const std::string& name) {
  if (name == "constant") return LrScheduler::Constant;
  if (name == "constant_with_warmup") return LrScheduler::ConstantWithWarmup;
  if (name == "cosine") return LrScheduler::Cosine;
  throw ValidationError("lr_scheduler", name,
                        "[train] lr_scheduler must be one of constant, constant_with_warmup, cosine, got '" +
                            name + "'");
}

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
  if (s.kind == LrScheduler::Constant) return s.learning_rate;
  if (step < s.warmup_steps) {
    return s.learning_rate * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, s.warmup_steps));
  }
  if (s.kind == LrScheduler::ConstantWithWarmup) return s.learning_rate;
  const double progress = static_cast<double>(step - s.warmup_steps) /
                          static_cast<double>(std::max<int64_t>(1, s.total_steps - s.warmup_steps));
  const double factor = 0.5 * (1.0 + std::cos(kPi * s.num_cycles * 2.0 * progress));
  return s.learning_rate * std::max(0.0, factor);
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
