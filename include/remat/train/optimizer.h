#pragma once
/// \file
/// The optimizer factory: every optimizer remat builds (the trainer's, the benchmark's, the
/// auto-layout profile's scratch copy) comes from here, so a new optimizer is added in one place.
/// AdamW (decoupled weight decay) for now.

#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

#include "remat/export.h"

namespace remat::train {

struct TrainConfig;

/// What to build: SimpleTuner's option values.
struct OptimizerSettings {
  std::string name = "adamw";
  double learning_rate = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double weight_decay = 1e-2;
};

/// The optimizer options of a run (optimizer, learning_rate, adam_*).
REMAT_API OptimizerSettings optimizer_settings(const TrainConfig& config);

/// The settings an existing optimizer was built with (to build another like it).
REMAT_API OptimizerSettings optimizer_settings(const torch::optim::Optimizer& optimizer);

/// Builds the optimizer of `settings` over `parameters`. Throws c10::ValueError naming the
/// optimizers remat has for an unknown name.
REMAT_API std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor>& parameters,
                                                                  const OptimizerSettings& settings);

/// Sets the learning rate of every parameter group.
REMAT_API void set_learning_rate(torch::optim::Optimizer& optimizer, double learning_rate);

}  // namespace remat::train
