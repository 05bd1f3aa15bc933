#pragma once
/// \file
/// EMA weights: an exponential moving average of the trainable parameters, kept beside them and
/// updated after optimizer steps, as SimpleTuner's `--use_ema` does
/// (simpletuner/helpers/training/ema.py, EMAModel, at bghira/SimpleTuner bc8e6ab7).
///
/// After optimizer step t (SimpleTuner's global step), when t is a multiple of
/// ema_update_interval, every shadow tensor s of parameter p becomes
///     s = d * s + (1 - d) * p,      d = ema_decay_at(settings, t)
/// which is EMAModel.step's `s.sub_((1 - d) * (s - p))` with the same value, computed in place
/// without its (s - p) temporary. The decay follows EMAModel.get_decay: 0 at step 1 (the shadow
/// becomes the weights), then min(ema_decay, (1 + n) / (10 + n)) with n = t - 1; with
/// ema_warmup_steps > 0 it is 0 before that step and ema_decay from it on.
///
/// Where remat differs from SimpleTuner, and why:
///  - The shadow is float32 whatever the weights' dtype. SimpleTuner casts it to weight_dtype
///    (bfloat16 under mixed precision, and the weights themselves under adamw_bf16), where each
///    update of (1 - d) * (p - s) below 2^-9 of s rounds away: at ema_decay 0.995 a weight must move
///    by 40 % in one step for the average to move at all.
///  - ema_device cpu without ema_cpu_only updates on the training device one tensor at a time
///    (copied over, updated, copied back), so the device holds one tensor of it at most, where
///    SimpleTuner moves the whole average to the device for the update.
///  - Every data-parallel rank keeps its own copy (SimpleTuner keeps it on rank 0): the weights are
///    equal on every rank after each step, so the copies are too, and any rank can render or save.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "remat/export.h"
#include "remat/io/safetensors.h"

namespace remat::train {

struct TrainConfig;

/// SimpleTuner's EMA options (TrainConfig's use_ema ... ema_warmup_steps).
struct EmaSettings {
  double decay = 0.995;           ///< ema_decay: the largest decay used
  int64_t update_interval = 1;    ///< ema_update_interval: update after steps that are multiples of it
  int64_t warmup_steps = 0;       ///< ema_warmup_steps: copy the weights before this step, then `decay`
  bool foreach = true;            ///< !ema_foreach_disable: one fused kernel per update, else per tensor
  /// ema_device accelerator: the shadow lives on the training device. cpu: in host memory.
  bool on_training_device = false;
  /// ema_cpu_only: with the shadow on the host, update it there (the weights are copied to the host
  /// one at a time) instead of on the training device.
  bool cpu_only = false;
};

/// The settings of a validated config (use_ema must be true).
REMAT_API EmaSettings ema_settings(const TrainConfig& config);

/// EMAModel.get_decay(step) with SimpleTuner's arguments (min_decay 0, update_after_step 0, no
/// use_ema_warmup): the decay applied by the update after optimizer step `step` (>= 1).
REMAT_API double ema_decay_at(const EmaSettings& settings, int64_t step);

/// The folder of a training checkpoint, and of a full fine-tune's output, holding the EMA weights:
/// SimpleTuner's `{MODEL_SUBFOLDER}_ema` (save_hooks.py, SaveHookManager.ema_model_subdir).
inline constexpr const char* kEmaCheckpointFolder = "transformer_ema";
/// The file in it: the shadow tensors by parameter name, the schedule's state as metadata.
inline constexpr const char* kEmaCheckpointFile = "ema_model.safetensors";
/// A LoRA run's EMA adapter goes to output_dir/ema/ (save_hooks.py, _save_lora: "ema").
inline constexpr const char* kEmaLoraFolder = "ema";

class REMAT_API ExponentialMovingAverage {
 public:
  using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;
  /// Starts the average at the current values of `parameters` (the trainer's trainable tensors,
  /// which it keeps referring to), on the host or on `training_device` as `settings` say.
  ExponentialMovingAverage(const NamedParameters& parameters, EmaSettings settings, const at::Device& training_device);

  /// After optimizer step `step`: updates the average when `step` is a multiple of the interval.
  /// Returns whether it did.
  bool step(int64_t step);

  /// The decay of the last update (0 before any).
  double last_decay() const { return last_decay_; }
  /// The step of the last update (0 before any).
  int64_t optimization_step() const { return optimization_step_; }
  /// Bytes of the shadow tensors.
  int64_t bytes() const;
  /// Where the shadow lives.
  at::Device device() const;

  /// The shadow tensors, by parameter name, for a checkpoint; `metadata` gets EMAModel.state_dict's
  /// scalars (decay, optimization_step, ...) as text.
  std::vector<io::NamedTensor> state(std::map<std::string, std::string>* metadata) const;
  /// Starts the average again at the parameters' current values (a resume from a checkpoint
  /// written without EMA).
  void restart();
  /// Restores what state() returned (checked by the caller: one tensor per parameter, same shapes).
  void load_state(const std::vector<io::NamedTensor>& tensors, const std::map<std::string, std::string>& metadata);

  /// While alive, the parameters hold the average; the destructor puts the trained values back
  /// (EMAModel.store / copy_to / restore).
  class REMAT_API Swap {
   public:
    explicit Swap(ExponentialMovingAverage& ema);
    ~Swap();
    Swap(const Swap&) = delete;
    Swap& operator=(const Swap&) = delete;

   private:
    ExponentialMovingAverage& ema_;
    std::vector<at::Tensor> stored_;
  };

 private:
  NamedParameters parameters_;
  std::vector<at::Tensor> shadow_;
  EmaSettings settings_;
  at::Device training_device_;
  double last_decay_ = 0;
  int64_t optimization_step_ = 0;
};

}  // namespace remat::train
