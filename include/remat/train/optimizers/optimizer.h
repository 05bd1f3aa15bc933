#pragma once
/// \file
/// The optimizer factory: every optimizer remat builds (the trainer's, the benchmark's, the
/// auto-layout profile's scratch copy) comes from here, so a new optimizer is added in one place.
/// The names, defaults and update rules are SimpleTuner's (helpers/training/optimizer_param.py):
///  - "adamw_bf16": SimpleTuner's AdamWBF16, which keeps the weights in bfloat16 (no fp32 master
///    copy) and updates them with stochastic rounding plus a bf16 compensation buffer; remat runs
///    the same arithmetic on weights whose values it keeps bf16-exact (Note [AdamWBF16] in
///    optimizer.cpp);
///  - "torch-adamw": PyTorch's AdamW;
///  - "optimi-lion": optimi's Lion (sign of an interpolated momentum), without Kahan summation
///    (optimi applies it to bf16/fp16 weights only; remat's trainable weights are fp32).

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

#include "remat/export.h"

namespace remat::train {

struct TrainConfig;

/// The optimizers remat implements, by SimpleTuner's names.
REMAT_API const std::vector<std::string>& optimizer_names();

/// What to build: an optimizer and its hyperparameters.
struct OptimizerSettings {
  std::string name = "torch-adamw";
  double learning_rate = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;        ///< AdamW variants
  double weight_decay = 1e-2;
  bool amsgrad = false;         ///< torch-adamw
  bool decouple_lr = false;     ///< optimi-lion: decay by lr / max_lr * weight_decay instead of lr * weight_decay
  std::optional<double> max_lr; ///< optimi-lion with decouple_lr (default: learning_rate)

  /// SimpleTuner's defaults for `name` (its optimizer_param.py default_settings) at
  /// `learning_rate`. Throws c10::ValueError naming the optimizers remat has for another name.
  static OptimizerSettings defaults_of(const std::string& name, double learning_rate);
};

/// The optimizer of a run, as SimpleTuner assembles it: the optimizer's defaults, then the keys
/// of optimizer_config ("weight_decay=0.0,eps=1e-8"), then optimizer_beta1/2 when both are set.
/// Keys the optimizer does not take are dropped with a warning (appended to `warnings`), as
/// SimpleTuner drops them. Throws ValidationError (option optimizer_config) for a malformed value
/// or a setting remat does not implement (maximize=true).
REMAT_API OptimizerSettings optimizer_settings(const TrainConfig& config,
                                               std::vector<std::string>* warnings = nullptr);

/// The settings an existing optimizer (built by make_optimizer) was built with, at its current
/// learning rate.
REMAT_API OptimizerSettings optimizer_settings(const torch::optim::Optimizer& optimizer);

/// Builds the optimizer of `settings` over `parameters`. Throws c10::ValueError naming the
/// optimizers remat has for an unknown name.
REMAT_API std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor>& parameters,
                                                                  const OptimizerSettings& settings);

/// Sets the learning rate of every parameter group.
REMAT_API void set_learning_rate(torch::optim::Optimizer& optimizer, double learning_rate);

/// The per-parameter state of an optimizer from make_optimizer, as named tensors
/// ("<name>.<field>": AdamW's exp_avg, exp_avg_sq, step; AdamWBF16's exp_avg, exp_avg_sq, shift,
/// step, accumulated_decay; Lion's exp_avg). Parameters without state (never stepped) are omitted.
/// Throws c10::Error for a ZeroRedundancyOptimizer (its state is sharded: gather_full_state,
/// remat/train/optimizers/zero_optimizer.h, collects it on rank 0).
REMAT_API std::vector<std::pair<std::string, at::Tensor>> optimizer_state(
    torch::optim::Optimizer& optimizer, const std::vector<std::pair<std::string, at::Tensor>>& params);

/// Restores what optimizer_state() produced for the same named parameters (a
/// ZeroRedundancyOptimizer keeps the state of the tensors its rank owns). Throws c10::Error
/// naming the parameter when a field is missing or has the wrong shape.
REMAT_API void restore_optimizer_state(torch::optim::Optimizer& optimizer,
                                       const std::vector<std::pair<std::string, at::Tensor>>& params,
                                       const std::vector<std::pair<std::string, at::Tensor>>& state);

/// The state fields each stepped parameter of `optimizer` has, as optimizer_state names them
/// (torch-adamw: exp_avg, exp_avg_sq, step, and max_exp_avg_sq with amsgrad).
REMAT_API std::vector<std::string> optimizer_state_fields(torch::optim::Optimizer& optimizer);

/// True when the optimizer holds state for any parameter (it has stepped or been restored).
REMAT_API bool optimizer_has_state(torch::optim::Optimizer& optimizer);

/// Bytes of state the optimizer of `settings` keeps for `parameters` once it has stepped:
/// AdamW two moments in the parameters' dtype (three with amsgrad), AdamWBF16 three bf16
/// buffers, Lion one momentum.
REMAT_API int64_t optimizer_state_bytes(const OptimizerSettings& settings,
                                        const std::vector<at::Tensor>& parameters);

}  // namespace remat::train
