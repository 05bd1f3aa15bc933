#pragma once
/// \file
/// One training step, in phases with seams: forward and loss -> backward (per micro-batch) ->
/// gradient sync -> clipping -> optimizer step, with observers around each phase. `remat train`,
/// `remat bench` and the auto-layout profile all run this one step.
///
/// Nothing in the step waits for the device or reads a tensor back to the host unless an observer
/// asks for it: the loss and gradient norm stay on the device (StepResult) until the caller reads
/// them, so `remat train` reads them once per logged step. TimingObserver synchronises at each
/// phase boundary (the benchmark's figures); PeakMemoryObserver reads the allocator's counters.
///
/// Seams: a GradientSynchronizer sees every micro-batch's forward and backward (data-parallel
/// training reduces the gradients inside the last backward, overlapped with it) and finishes
/// before clipping; observers see every phase (metrics, UIs, profilers).

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "remat/export.h"
#include "remat/train/data/data.h"
#include "remat/train/family/transformer.h"

namespace remat::train {

/// How a step runs besides the model and data.
struct StepSettings {
  FlowMatchingOptions flow;
  /// Autocast dtype for the forward pass (bf16 mixed precision on the model's device); nullopt:
  /// no autocast.
  std::optional<at::ScalarType> autocast;
  /// Clip the gradients to this before the optimizer step (as clip_by_value says); 0: no clipping.
  double max_grad_norm = 0.0;
  /// false: scale all gradients so their global L2 norm is at most max_grad_norm (SimpleTuner's
  /// grad_clip_method norm); true: clamp every gradient element to [-max_grad_norm,
  /// max_grad_norm] (its method value, PyTorch's clip_grad_value_).
  bool clip_by_value = false;
  /// Compute the gradient norm even without clipping (for reporting).
  bool measure_grad_norm = false;
};

/// The phases of a step, in order. ForwardBackward runs once per micro-batch.
enum class StepPhase { ForwardBackward, GradientSync, Clip, OptimizerStep };

/// What a step leaves for its caller, on the device.
struct StepResult {
  /// The loss of each micro-batch (float32 scalars, detached).
  std::vector<at::Tensor> micro_losses;
  /// The global gradient L2 norm before clipping; undefined unless clipped or measured.
  at::Tensor grad_norm;

  /// The mean loss over the micro-batches (reads the device).
  double loss() const;
  /// grad_norm as a number, 0 when undefined (reads the device).
  double grad_norm_value() const;
};

/// Sees the phases of a step. Every method has an empty default.
class REMAT_API StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void step_begin(const c10::Device& device) {}
  virtual void phase_begin(StepPhase phase, const c10::Device& device) {}
  /// After the phase, before the next begins. ForwardBackward also reports its forward part
  /// (from the start to the loss) through forward_done.
  virtual void forward_done(const c10::Device& device) {}
  virtual void phase_end(StepPhase phase, const c10::Device& device) {}
  virtual void step_end(const StepResult& result, const c10::Device& device) {}
};

/// Keeps the gradients of several processes in step (data-parallel training). The step calls it
/// around each micro-batch; single-process training has none. remat's implementation wraps
/// c10d's Reducer (remat/distributed/gradient_reducer.h), whose all-reduce runs inside the last
/// micro-batch's backward, overlapped with it; `finish` then only completes what is left.
class REMAT_API GradientSynchronizer {
 public:
  virtual ~GradientSynchronizer() = default;
  /// Before each micro-batch's forward; `last`: the step's last micro-batch, the one whose
  /// backward synchronises (the others accumulate locally, as DDP's no_sync).
  virtual void before_forward(bool last) {}
  /// After the forward, before backward from `loss` (the scaled loss backward starts from).
  virtual void before_backward(const at::Tensor& loss, bool last) {}
  /// After that micro-batch's backward.
  virtual void after_backward(bool last) {}
  /// After the last backward, before clipping: the GradientSync phase (waits for what is left).
  virtual void finish(const std::vector<at::Tensor>& parameters) {}
  /// Whether the gradients are views into communication buffers: the step then zeroes them at
  /// its start instead of freeing them at its end (freeing would allocate them anew each step).
  virtual bool gradients_are_views() const { return false; }
};

/// One optimizer step over micro-batches, phase by phase.
class REMAT_API TrainingStep {
 public:
  /// `parameters` are the trainable tensors `optimizer` updates. The references must outlive
  /// the step object.
  TrainingStep(Transformer& model, torch::optim::Optimizer& optimizer, std::vector<at::Tensor> parameters,
               StepSettings settings);

  /// Observers are called in the order added; not owned.
  void add_observer(StepObserver* observer);
  /// Not owned; nullptr (the default): one process.
  void set_gradient_synchronizer(GradientSynchronizer* sync) { sync_ = sync; }
  const StepSettings& settings() const { return settings_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }

  /// The whole step: gradients set to none, then for each micro-batch (gradient accumulation:
  /// each loss scaled by 1/n) the flow-matching loss under autocast and its backward, then the
  /// gradient sync, clipping (max_grad_norm > 0, or the norm measured), optimizer.step(), and the
  /// gradients freed. The batches must be on the model's device; `generator` supplies noise and
  /// sigmas, in batch order.
  StepResult run(const std::vector<Batch>& micro_batches, at::Generator& generator);

  // The phases, for callers that run part of a step (the auto-layout profile runs one
  // forward-backward and no update).
  /// Forward and backward of each micro-batch, gradients accumulated; returns the losses.
  std::vector<at::Tensor> forward_backward(const std::vector<Batch>& micro_batches, at::Generator& generator);
  /// The gradient synchronizer's finish, when there is one.
  void sync_gradients();
  /// Clips (or only measures) the global gradient norm; undefined when neither is asked for.
  at::Tensor clip_gradients();
  /// optimizer.step().
  void optimizer_step();

 private:
  void begin(StepPhase phase);
  void end(StepPhase phase);

  Transformer& model_;
  torch::optim::Optimizer& optimizer_;
  std::vector<at::Tensor> parameters_;
  StepSettings settings_;
  GradientSynchronizer* sync_ = nullptr;
  std::vector<StepObserver*> observers_;
  c10::Device device_{c10::kCPU};
};

/// Clips the global L2 norm of the gradients of `parameters` to `max_norm` (infinity: measure
/// only) exactly as torch::nn::utils::clip_grad_norm_ does, without reading the norm back to
/// the host. Returns the norm before clipping (undefined when no parameter has a gradient).
REMAT_API at::Tensor clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm);

/// What one step took, as the benchmark and the profile report it. Times in seconds, the
/// device synchronised at each boundary.
struct StepMeasurement {
  double step_s = 0.0;
  double forward_s = 0.0;    ///< from the step's start to the loss (noise, sigmas, forward, loss)
  double backward_s = 0.0;
  double optimizer_s = 0.0;  ///< gradient sync, clipping and the optimizer step
  /// memory::peak_bytes(device) over the step after a reset at its start: absolute, parameters,
  /// gradients and optimizer state included (torch.cuda.max_memory_allocated's figure on CUDA).
  int64_t peak_bytes = 0;
  double loss = 0.0;          ///< mean over the micro-batches
  double grad_norm = 0.0;     ///< before clipping; 0 unless clipped or measure_grad_norm
};

/// Resets the peak at the step's start and reads it at the end (no synchronisation: the
/// allocator counts at allocation time).
class REMAT_API PeakMemoryObserver : public StepObserver {
 public:
  void step_begin(const c10::Device& device) override;
  void step_end(const StepResult& result, const c10::Device& device) override;
  int64_t peak_bytes() const { return peak_bytes_; }

 private:
  int64_t peak_bytes_ = 0;
};

/// Synchronises the device at every phase boundary and times the phases (StepMeasurement's
/// times). For benchmarks: it costs a device round trip per boundary.
class REMAT_API TimingObserver : public StepObserver {
 public:
  void step_begin(const c10::Device& device) override;
  void phase_begin(StepPhase phase, const c10::Device& device) override;
  void forward_done(const c10::Device& device) override;
  void phase_end(StepPhase phase, const c10::Device& device) override;
  void step_end(const StepResult& result, const c10::Device& device) override;
  /// The times of the last step.
  const StepMeasurement& times() const { return times_; }

 private:
  using Clock = std::chrono::steady_clock;
  StepMeasurement times_;
  Clock::time_point step_start_, phase_start_;
};

/// Runs one TrainingStep with a TimingObserver and a PeakMemoryObserver and reads the loss: the
/// measured step of `remat bench` and the auto-layout profile.
REMAT_API StepMeasurement run_training_step(Transformer& model, torch::optim::Optimizer& optimizer,
                                            const std::vector<at::Tensor>& parameters,
                                            const std::vector<Batch>& micro_batches,
                                            const StepSettings& settings, at::Generator& generator);

/// The same for one batch.
REMAT_API StepMeasurement run_training_step(Transformer& model, torch::optim::Optimizer& optimizer,
                                            const std::vector<at::Tensor>& parameters,
                                            const Batch& batch, const StepSettings& settings,
                                            at::Generator& generator);

/// Waits for the work queued on `device` (no-op on CPU).
REMAT_API void synchronize_device(const c10::Device& device);

}  // namespace remat::train
