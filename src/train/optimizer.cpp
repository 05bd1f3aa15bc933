#include "remat/train/optimizer.h"

#include <torch/optim/adamw.h>

#include "remat/error.h"
#include "remat/train/config.h"

namespace remat::train {

OptimizerSettings optimizer_settings(const TrainConfig& config) {
  return {config.optimizer,  config.learning_rate, config.adam_beta1,
          config.adam_beta2, config.adam_epsilon,  config.adam_weight_decay};
}

OptimizerSettings optimizer_settings(const torch::optim::Optimizer& optimizer) {
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamW*>(&optimizer)) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(adamw->param_groups().front().options());
    return {"adamw", o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay()};
  }
  throw_value_error("[optimizer] only AdamW optimizers are known to remat");
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor>& parameters,
                                                        const OptimizerSettings& s) {
  if (s.name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        parameters, torch::optim::AdamWOptions(s.learning_rate)
                        .betas({s.beta1, s.beta2})
                        .eps(s.epsilon)
                        .weight_decay(s.weight_decay));
  }
  throw_value_error("[optimizer] optimizer must be one of adamw, got '" + s.name + "'");
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double learning_rate) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(learning_rate);
}

}  // namespace remat::train
