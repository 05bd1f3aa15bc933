// Flow-matching sigmas (remat/train/family/flow_matching.h). The shift is SimpleTuner's
// apply_flow_schedule_shift (SD3 paper §5.3.2); the sigma sampling is SimpleTuner's
// ModelFoundation.sample_flow_sigmas default (sigmoid of a scaled normal) and its
// --flow_use_uniform_schedule branch.
#include "remat/train/family/flow_matching.h"

#include <ATen/ATen.h>

#include "remat/train/options/config.h"

namespace remat::train {

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
