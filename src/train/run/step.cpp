// One training step in phases (remat/train/run/step.h).
#include "remat/train/run/step.h"

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include "remat/autocast.h"
#include "remat/memory.h"

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

double StepResult::loss() const {
  // Accumulated in double, one micro-batch at a time, as the mean has always been computed.
  const double n = static_cast<double>(micro_losses.size());
  double mean = 0.0;
  for (const auto& l : micro_losses) mean += l.item<double>() / n;
  return mean;
}

double StepResult::grad_norm_value() const { return grad_norm.defined() ? grad_norm.item<double>() : 0.0; }

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm) {
  // torch::nn::utils::clip_grad_norm_ (norm 2) step for step, minus its final item().
  std::vector<at::Tensor> norms;
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) {
    if (!p.grad().defined()) continue;
    grads.push_back(p.grad());
    // On the first gradient's device: streamed trained weights have theirs on the host.
    const at::Tensor norm = p.grad().data().norm(2.0);
    norms.push_back(norms.empty() ? norm : norm.to(norms.front().device()));
  }
  if (norms.empty()) return {};
  at::Tensor total = norms.size() == 1 ? norms[0] : at::stack(norms).norm(2.0);
  const at::Tensor coefficient = at::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  for (auto& g : grads) g.data().mul_(coefficient.device() == g.device() ? coefficient : coefficient.to(g.device()));
  return total;
}

TrainingStep::TrainingStep(Transformer& model, torch::optim::Optimizer& optimizer,
                           std::vector<at::Tensor> parameters, StepSettings settings)
    : model_(model), optimizer_(optimizer), parameters_(std::move(parameters)), settings_(settings) {}

void TrainingStep::add_observer(StepObserver* observer) { observers_.push_back(observer); }

void TrainingStep::begin(StepPhase phase) {
  for (auto* o : observers_) o->phase_begin(phase, device_);
}

void TrainingStep::end(StepPhase phase) {
  for (auto* o : observers_) o->phase_end(phase, device_);
}

std::vector<at::Tensor> TrainingStep::forward_backward(const std::vector<Batch>& micro_batches,
                                                       at::Generator& generator) {
  TORCH_CHECK_VALUE(!micro_batches.empty(), "[step] needs at least one micro-batch");
  device_ = micro_batches.front().latents.device();
  const double n = static_cast<double>(micro_batches.size());
  const AutocastSnapshot autocast = AutocastSnapshot::with(settings_.autocast, device_);
  std::vector<at::Tensor> losses;
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const Batch& batch = micro_batches[i];
    const bool last = i + 1 == micro_batches.size();
    begin(StepPhase::ForwardBackward);
    if (sync_) sync_->before_forward(last);
    at::Tensor loss;
    {
      AutocastGuard mixed_precision(autocast);
      if (batch.noise_seed) {
        at::Generator own = at::detail::createCPUGenerator(*batch.noise_seed);
        loss = model_.flow_matching_loss(batch, settings_.flow, own);
      } else {
        loss = model_.flow_matching_loss(batch, settings_.flow, generator);
      }
    }
    for (auto* o : observers_) o->forward_done(device_);
    // Gradient accumulation scales each loss by 1/n (exact, and skipped, for one micro-batch).
    const at::Tensor scaled = micro_batches.size() == 1 ? loss : loss / n;
    if (sync_) sync_->before_backward(scaled, last);
    scaled.backward();
    // Streamed trained weights' gradients go to the host copies the optimizer steps.
    if (models::BlockSwap* swap = model_.block_swap()) swap->finish_backward();
    if (sync_) sync_->after_backward(last);
    // A copy of the value alone: the loss may share a larger reduction buffer (16 KiB on CPU),
    // which would otherwise stay alive through the optimizer step.
    losses.push_back(loss.detach().clone());
    end(StepPhase::ForwardBackward);
  }
  return losses;
}

void TrainingStep::sync_gradients() {
  if (!sync_) return;
  begin(StepPhase::GradientSync);
  sync_->finish(parameters_);
  end(StepPhase::GradientSync);
}

at::Tensor TrainingStep::clip_gradients() {
  if (!(settings_.max_grad_norm > 0) && !settings_.measure_grad_norm) return {};
  begin(StepPhase::Clip);
  const bool by_value = settings_.clip_by_value && settings_.max_grad_norm > 0;
  const double max_norm = settings_.max_grad_norm > 0 && !by_value ? settings_.max_grad_norm : INFINITY;
  at::Tensor norm = clip_grad_norm(parameters_, max_norm);  // with by_value: measures only
  if (by_value) {
    for (const auto& p : parameters_) {
      if (p.grad().defined()) p.grad().data().clamp_(-settings_.max_grad_norm, settings_.max_grad_norm);
    }
  }
  end(StepPhase::Clip);
  return norm;
}

void TrainingStep::optimizer_step() {
  begin(StepPhase::OptimizerStep);
  optimizer_.step();
  end(StepPhase::OptimizerStep);
}

StepResult TrainingStep::run(const std::vector<Batch>& micro_batches, at::Generator& generator) {
  TORCH_CHECK_VALUE(!micro_batches.empty(), "[step] needs at least one micro-batch");
  device_ = micro_batches.front().latents.device();
  const bool views = sync_ && sync_->gradients_are_views();
  for (auto p : parameters_) {
    if (!views) p.mutable_grad().reset();
    else if (p.grad().defined()) p.mutable_grad().zero_();
  }
  for (auto* o : observers_) o->step_begin(device_);
  StepResult result;
  result.micro_losses = forward_backward(micro_batches, generator);
  sync_gradients();
  result.grad_norm = clip_gradients();
  optimizer_step();
  if (!views) {
    for (auto p : parameters_) p.mutable_grad().reset();  // free gradients between steps
  }
  for (auto* o : observers_) o->step_end(result, device_);
  return result;
}

// ---- observers ----

void PeakMemoryObserver::step_begin(const c10::Device& device) { memory::reset_peak(); }

void PeakMemoryObserver::step_end(const StepResult&, const c10::Device& device) {
  peak_bytes_ = memory::peak_bytes(device);
}

void TimingObserver::step_begin(const c10::Device& device) {
  synchronize_device(device);
  times_ = StepMeasurement{};
  step_start_ = Clock::now();
}

void TimingObserver::phase_begin(StepPhase phase, const c10::Device& device) {
  phase_start_ = Clock::now();
}

void TimingObserver::forward_done(const c10::Device& device) {
  synchronize_device(device);
  times_.forward_s += since(phase_start_);
  phase_start_ = Clock::now();
}

void TimingObserver::phase_end(StepPhase phase, const c10::Device& device) {
  synchronize_device(device);
  const double s = since(phase_start_);
  if (phase == StepPhase::ForwardBackward) times_.backward_s += s;
  else times_.optimizer_s += s;
}

void TimingObserver::step_end(const StepResult&, const c10::Device& device) {
  synchronize_device(device);
  times_.step_s = since(step_start_);
}

StepMeasurement run_training_step(Transformer& model, torch::optim::Optimizer& optimizer,
                                  const std::vector<at::Tensor>& parameters,
                                  const std::vector<Batch>& micro_batches,
                                  const StepSettings& settings, at::Generator& generator) {
  TrainingStep step(model, optimizer, parameters, settings);
  TimingObserver timing;
  PeakMemoryObserver peak;
  step.add_observer(&timing);  // synchronise first, then reset the peak
  step.add_observer(&peak);
  const StepResult result = step.run(micro_batches, generator);
  StepMeasurement m = timing.times();
  m.peak_bytes = peak.peak_bytes();
  m.loss = result.loss();
  m.grad_norm = result.grad_norm_value();
  return m;
}

StepMeasurement run_training_step(Transformer& model, torch::optim::Optimizer& optimizer,
                                  const std::vector<at::Tensor>& parameters, const Batch& batch,
                                  const StepSettings& settings, at::Generator& generator) {
  return run_training_step(model, optimizer, parameters, std::vector<Batch>{batch}, settings,
                           generator);
}

}  // namespace remat::train
