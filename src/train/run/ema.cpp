#include "remat/train/run/ema.h"

#include <algorithm>
#include <cstdlib>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "remat/train/options/config.h"

namespace remat::train {
namespace {

std::string render(double v) { return c10::str(v); }

}  // namespace

EmaSettings ema_settings(const TrainConfig& config) {
  EmaSettings s;
  s.decay = config.ema_decay;
  s.update_interval = config.ema_update_interval;
  s.warmup_steps = config.ema_warmup_steps;
  s.foreach = !config.ema_foreach_disable;
  // SimpleTuner's configure_args: ema_cpu_only forces ema_device cpu.
  s.cpu_only = config.ema_cpu_only;
  s.on_training_device = config.ema_device == "accelerator" && !config.ema_cpu_only;
  return s;
}

double ema_decay_at(const EmaSettings& settings, int64_t step) {
  if (settings.warmup_steps > 0) return step < settings.warmup_steps ? 0.0 : settings.decay;
  const int64_t n = std::max<int64_t>(0, step - 1);
  if (n <= 0) return 0.0;
  const double warming = (1.0 + static_cast<double>(n)) / (10.0 + static_cast<double>(n));
  return std::max(0.0, std::min(warming, settings.decay));
}

ExponentialMovingAverage::ExponentialMovingAverage(const NamedParameters& parameters, EmaSettings settings,
                                                   const at::Device& training_device)
    : parameters_(parameters), settings_(settings), training_device_(training_device) {
  TORCH_CHECK_VALUE(settings_.update_interval >= 1, "[ema] ema_update_interval must be at least 1, got ",
                    settings_.update_interval);
  at::NoGradGuard no_grad;
  const at::Device where = settings_.on_training_device ? training_device_ : at::Device(at::kCPU);
  // Pinned host memory makes the per-tensor copies to and from the device asynchronous-capable.
  const bool pin = !settings_.on_training_device && !settings_.cpu_only && training_device_.is_cuda();
  shadow_.reserve(parameters_.size());
  for (const auto& [name, p] : parameters_) {
    at::Tensor s = at::empty(p.sizes(), p.options().dtype(at::kFloat).device(where).requires_grad(false));
    if (pin) s = s.pin_memory();
    s.copy_(p.detach());
    shadow_.push_back(std::move(s));
  }
}

bool ExponentialMovingAverage::step(int64_t step) {
  if (step % settings_.update_interval != 0) return false;
  at::NoGradGuard no_grad;
  optimization_step_ = step;
  const double d = ema_decay_at(settings_, step);
  last_decay_ = d;
  const double w = 1.0 - d;
  const at::Device where = shadow_.empty() ? training_device_ : shadow_.front().device();
  const bool same_device = where == training_device_;
  bool all_float = true;
  for (const auto& [name, p] : parameters_) all_float = all_float && p.scalar_type() == at::kFloat;
  if (settings_.foreach && same_device && all_float) {
    // One fused kernel over every tensor: the same arithmetic as the loop below, element for element.
    std::vector<at::Tensor> params;
    params.reserve(parameters_.size());
    for (const auto& [name, p] : parameters_) params.push_back(p.detach());
    at::_foreach_mul_(shadow_, d);
    at::_foreach_add_(shadow_, params, w);
    return true;
  }
  for (size_t i = 0; i < shadow_.size(); ++i) {
    const at::Tensor p = parameters_[i].second.detach();
    at::Tensor& s = shadow_[i];
    if (same_device) {
      s.mul_(d).add_(p.to(at::kFloat), w);
    } else if (settings_.cpu_only) {
      s.mul_(d).add_(p.to(at::kCPU).to(at::kFloat), w);  // on the host
    } else {
      // The shadow on the host, updated on the device one tensor at a time.
      at::Tensor on_device = s.to(training_device_, /*non_blocking=*/true);
      on_device.mul_(d).add_(p.to(at::kFloat), w);
      s.copy_(on_device);
    }
  }
  return true;
}

int64_t ExponentialMovingAverage::bytes() const {
  int64_t total = 0;
  for (const auto& s : shadow_) total += s.numel() * static_cast<int64_t>(s.element_size());
  return total;
}

at::Device ExponentialMovingAverage::device() const {
  return shadow_.empty() ? at::Device(at::kCPU) : shadow_.front().device();
}

std::vector<io::NamedTensor> ExponentialMovingAverage::state(std::map<std::string, std::string>* metadata) const {
  std::vector<io::NamedTensor> out;
  out.reserve(shadow_.size());
  for (size_t i = 0; i < shadow_.size(); ++i) out.emplace_back(parameters_[i].first, shadow_[i]);
  if (metadata) {
    // EMAModel.state_dict's scalars, under its names.
    *metadata = {{"decay", render(settings_.decay)},
                 {"min_decay", "0"},
                 {"optimization_step", std::to_string(optimization_step_)},
                 {"update_after_step", "0"},
                 {"warmup_steps", std::to_string(settings_.warmup_steps)},
                 {"use_ema_warmup", "false"},
                 {"inv_gamma", "1"},
                 {"power", render(2.0 / 3.0)}};
  }
  return out;
}

void ExponentialMovingAverage::restart() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < shadow_.size(); ++i) shadow_[i].copy_(parameters_[i].second.detach());
  optimization_step_ = 0;
  last_decay_ = 0;
}

void ExponentialMovingAverage::load_state(const std::vector<io::NamedTensor>& tensors,
                                          const std::map<std::string, std::string>& metadata) {
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < shadow_.size(); ++i) shadow_[i].copy_(by_name.at(parameters_[i].first));
  // validate_training_checkpoint has checked it: an integer in [0, global_step].
  if (const auto it = metadata.find("optimization_step"); it != metadata.end()) {
    optimization_step_ = std::strtoll(it->second.c_str(), nullptr, 10);
  }
  last_decay_ = optimization_step_ > 0 ? ema_decay_at(settings_, optimization_step_) : 0.0;
}

ExponentialMovingAverage::Swap::Swap(ExponentialMovingAverage& ema) : ema_(ema) {
  at::NoGradGuard no_grad;
  stored_.reserve(ema_.shadow_.size());
  for (size_t i = 0; i < ema_.shadow_.size(); ++i) {
    at::Tensor p = ema_.parameters_[i].second;
    stored_.push_back(p.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
    p.detach().copy_(ema_.shadow_[i]);
  }
}

ExponentialMovingAverage::Swap::~Swap() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < stored_.size(); ++i) ema_.parameters_[i].second.detach().copy_(stored_[i]);
}

}  // namespace remat::train
