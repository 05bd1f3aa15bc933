// One measured training step, shared by `remat bench` and the auto-layout profile.
#include "remat/train/step.h"

#include <chrono>
#include <cmath>

#include <c10/core/impl/VirtualGuardImpl.h>

#include "remat/memory.h"
#include "train/step_impl.h"

namespace remat::train {
namespace {

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void synchronize_device(const c10::Device& device) {
  if (device.is_cpu()) return;
  c10::impl::VirtualGuardImpl impl(device.type());
  impl.getStream(device).synchronize();
}

detail::AutocastSnapshot autocast_snapshot(const std::optional<at::ScalarType>& dtype,
                                           const c10::Device& device) {
  detail::AutocastSnapshot s = detail::AutocastSnapshot::capture();
  if (dtype) {
    if (device.is_cuda()) {
      s.cuda_enabled = true;
      s.cuda_dtype = *dtype;
    } else {
      s.cpu_enabled = true;
      s.cpu_dtype = *dtype;
    }
  }
  return s;
}

StepMeasurement run_training_step(Transformer& model, torch::optim::Optimizer& optimizer,
                                  const std::vector<at::Tensor>& parameters,
                                  const std::vector<Batch>& micro_batches,
                                  const StepSettings& settings, at::Generator& generator) {
  TORCH_CHECK_VALUE(!micro_batches.empty(), "[step] needs at least one micro-batch");
  const c10::Device device = micro_batches.front().latents.device();
  const double n = static_cast<double>(micro_batches.size());
  for (auto p : parameters) p.mutable_grad().reset();
  synchronize_device(device);
  memory::reset_peak();
  StepMeasurement m;
  const auto start = std::chrono::steady_clock::now();
  const auto autocast = autocast_snapshot(settings.autocast, device);
  for (const Batch& batch : micro_batches) {
    const auto forward_start = std::chrono::steady_clock::now();
    at::Tensor loss;
    {
      detail::AutocastGuard mixed_precision(autocast);
      loss = model.flow_matching_loss(batch, settings.flow, generator);
    }
    synchronize_device(device);
    m.forward_s += since(forward_start);
    const auto backward_start = std::chrono::steady_clock::now();
    (loss / n).backward();
    synchronize_device(device);
    m.backward_s += since(backward_start);
    m.loss += loss.item<double>() / n;
  }
  const auto optimizer_start = std::chrono::steady_clock::now();
  if (settings.max_grad_norm > 0 || settings.measure_grad_norm) {
    const double max_norm = settings.max_grad_norm > 0 ? settings.max_grad_norm : INFINITY;
    m.grad_norm = torch::nn::utils::clip_grad_norm_(parameters, max_norm);
  }
  optimizer.step();
  synchronize_device(device);
  m.optimizer_s = since(optimizer_start);
  m.step_s = since(start);
  for (auto p : parameters) p.mutable_grad().reset();  // free gradients between steps
  m.peak_bytes = memory::peak_bytes(device);
  return m;
}

StepMeasurement run_training_step(Transformer& model, torch::optim::Optimizer& optimizer,
                                  const std::vector<at::Tensor>& parameters, const Batch& batch,
                                  const StepSettings& settings, at::Generator& generator) {
  return run_training_step(model, optimizer, parameters, std::vector<Batch>{batch}, settings,
                           generator);
}

}  // namespace remat::train
