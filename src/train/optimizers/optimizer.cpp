// The optimizer factory and remat's two own optimizers (AdamWBF16, Lion).
//
// Note [AdamWBF16]
// SimpleTuner's adamw_bf16 (helpers/training/optimizers/adamw_bfloat16) keeps the weights in
// bfloat16 - there is no fp32 master copy - and makes up for bf16's coarse steps with stochastic
// rounding and a bf16 "shift" buffer holding what the last rounding lost. Per step, with bf16
// state m (exp_avg), v (exp_avg_sq), s (shift) and SR(x) = stochastic rounding of fp32 x to bf16:
//   m = bf16(m * b1);  m = SR(g + (1 - b1) * m)      (its add_stochastic_ scales the moment by
//                                                     alpha, not the gradient; kept as it is)
//   v = bf16(v * b2 + (1 - b2) * g^2)
//   s = SR(s - lr * sqrt(1 - b2^t) * m / bf16(bf16(sqrt(v)) + eps))   (no first-moment bias
//                                                                       correction)
//   p_old = p;  p = SR(p + s);  s = SR(s + bf16(p_old - p))
//   weight decay: wd * lr accumulates per tensor (starting at a random fraction of 5e-3) and is
//   applied as s -= decay * p once it exceeds 5e-3.
// remat's trainable weights stay float32 tensors (so both mixed_precision settings work), but the
// optimizer rounds them to bf16 on its first step and only ever writes bf16 values into them, the
// gradient is rounded to bf16 first (SimpleTuner's would be bf16), and every operation above runs
// with the same ATen kernels and dtypes as SimpleTuner's. The random bits come from the default
// generator of the weights' device, which checkpoints save, so a resumed run is still exact.
#include "string_helpers.h"
#include "remat/train/optimizers/optimizer.h"

#include <cmath>
#include <cstdlib>
#include <map>

#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include "remat/compat.h"
#include "remat/util/error.h"
#include "remat/train/options/config.h"
#include "remat/train/optimizers/zero_optimizer.h"

namespace remat::train {
namespace {

using remat::detail::join;

using State = std::map<std::string, at::Tensor>;


// The learning rate of a parameter group (what set_learning_rate changes).
struct LrOptions : public torch::optim::OptimizerCloneableOptions<LrOptions> {
  explicit LrOptions(double lr) : lr(lr) {}
  double get_lr() const override { return lr; }
  void set_lr(const double value) override { lr = value; }
  double lr;
};

// An optimizer whose per-parameter state is a set of named tensors (saved as such in
// checkpoints). Subclasses implement the update of one parameter.
class NamedStateOptimizer : public torch::optim::Optimizer {
 public:
  NamedStateOptimizer(const std::vector<at::Tensor>& parameters, OptimizerSettings settings)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(parameters)},
                                std::make_unique<LrOptions>(settings.learning_rate)),
        settings_(std::move(settings)) {}

  at::Tensor step(LossClosure closure = nullptr) override {
    at::NoGradGuard no_grad;
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode enable(true);
      loss = closure();
    }
    for (auto& group : param_groups()) {
      const double lr = group.options().get_lr();
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        update(p, states_[p.unsafeGetTensorImpl()], lr);
      }
    }
    return loss;
  }

  const OptimizerSettings& settings() const { return settings_; }
  State* find(const at::Tensor& p) {
    auto it = states_.find(p.unsafeGetTensorImpl());
    return it == states_.end() ? nullptr : &it->second;
  }
  void set(const at::Tensor& p, State state) { states_[p.unsafeGetTensorImpl()] = std::move(state); }
  bool empty() const { return states_.empty(); }
  /// The state fields a stepped parameter has.
  virtual std::vector<std::string> fields() const = 0;

 protected:
  virtual void update(at::Tensor& p, State& state, double lr) = 0;
  OptimizerSettings settings_;

 private:
  std::map<const c10::TensorImpl*, State> states_;
};

// copy_stochastic_ of SimpleTuner's adamw_bfloat16/stochastic: fp32 `source` rounded to bf16 at
// random (up with probability equal to the dropped fraction), written into `target`.
void copy_stochastic(at::Tensor target, const at::Tensor& source) {
  at::Tensor bits = at::randint_like(source, 0, 1 << 16, source.options().dtype(at::kInt));
  bits.add_(source.view(at::kInt));
  bits.bitwise_and_(-65536);
  target.copy_(bits.view(at::kFloat));
}

// add_stochastic_(input, other, alpha): SR(other + alpha * input) into input (sic).
void add_stochastic(at::Tensor input, const at::Tensor& other, double alpha = 1.0) {
  at::Tensor result = other.to(at::kFloat).clone();
  result.add_(input, alpha);
  copy_stochastic(input, result);
}

class AdamWBF16 final : public NamedStateOptimizer {
 public:
  using NamedStateOptimizer::NamedStateOptimizer;
  static constexpr double kDecayThreshold = 5e-3;
  std::vector<std::string> fields() const override {
    return {"exp_avg", "exp_avg_sq", "shift", "step", "accumulated_decay"};
  }

 protected:
  void update(at::Tensor& p, State& state, double lr) override {
    TORCH_CHECK_VALUE(p.scalar_type() == at::kFloat || p.scalar_type() == at::kBFloat16,
                      "[optimizer] adamw_bf16 needs float32 or bfloat16 weights, got ", p.scalar_type());
    const auto bf16 = p.options().dtype(at::kBFloat16);
    if (state.empty()) {
      p.copy_(p.to(at::kBFloat16));  // SimpleTuner's weights are bf16 from the start
      state["step"] = at::zeros({}, at::kDouble);
      state["exp_avg"] = at::zeros(p.sizes(), bf16);
      state["exp_avg_sq"] = at::zeros(p.sizes(), bf16);
      state["shift"] = at::zeros(p.sizes(), bf16);
      state["accumulated_decay"] =
          at::full({}, (at::rand({}) * kDecayThreshold).item<double>(), at::kDouble);
    }
    const double b1 = settings_.beta1, b2 = settings_.beta2;
    const double step = state["step"].item<double>() + 1.0;
    state["step"].fill_(step);
    double accumulated = state["accumulated_decay"].item<double>() + settings_.weight_decay * lr;
    const double decay = accumulated > kDecayThreshold ? accumulated : 0.0;
    accumulated -= decay;
    state["accumulated_decay"].fill_(accumulated);

    const at::Tensor g = p.grad().to(at::kBFloat16);
    at::Tensor& m = state["exp_avg"];
    at::Tensor& v = state["exp_avg_sq"];
    at::Tensor& shift = state["shift"];
    m.mul_(b1);
    add_stochastic(m, g, 1.0 - b1);
    v.mul_(b2).addcmul_(g, g, 1.0 - b2);
    const double denom_correction = std::pow(1.0 - std::pow(b2, step), 0.5);
    at::Tensor updated = shift.to(at::kFloat);
    updated.addcdiv_(m, v.sqrt().add_(settings_.epsilon), -lr * denom_correction);
    copy_stochastic(shift, updated);
    at::Tensor weights = p.to(at::kBFloat16);  // bf16-exact: no rounding
    const at::Tensor before = weights.clone();
    add_stochastic(weights, shift);
    add_stochastic(shift, before.sub_(weights));
    if (decay > 0) shift.add_(weights, -decay);
    p.copy_(weights);
  }
};

class Lion final : public NamedStateOptimizer {
 public:
  using NamedStateOptimizer::NamedStateOptimizer;
  std::vector<std::string> fields() const override { return {"exp_avg"}; }

 protected:
  // optimi's _single_param_lion without Kahan summation (which optimi applies to bf16/fp16 only).
  void update(at::Tensor& p, State& state, double lr) override {
    if (state.empty()) state["exp_avg"] = at::zeros_like(p);
    const at::Tensor& g = p.grad();
    at::Tensor& m = state["exp_avg"];
    if (settings_.weight_decay != 0) {
      const double max_lr = settings_.max_lr.value_or(settings_.learning_rate);
      p.mul_(settings_.decouple_lr ? 1.0 - (lr / max_lr) * settings_.weight_decay
                                   : 1.0 - lr * settings_.weight_decay);
    }
    const at::Tensor update = m.lerp(g, 1.0 - settings_.beta1).sign_();
    m.lerp_(g, 1.0 - settings_.beta2);
    p.add_(update, -lr);
  }
};

// optimizer_config's value typing (SimpleTuner's convert_arg_to_parameters).
struct ConfigValue {
  std::string text;
  bool is_bool = false, flag = false;
};

[[noreturn]] void bad_config(const std::string& config, const std::string& why) {
  throw ValidationError("optimizer_config", config, "[train] optimizer_config " + why + ", got '" + config + "'");
}

double number_in(const std::string& config, const std::string& key, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v)) bad_config(config, key + " must be a number");
  return v;
}

bool bool_in(const std::string& config, const std::string& key, const std::string& text) {
  if (text == "true" || text == "True") return true;
  if (text == "false" || text == "False") return false;
  bad_config(config, key + " must be true or false");
}

}  // namespace

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"adamw_bf16", "torch-adamw", "optimi-lion"};
  return names;
}

OptimizerSettings OptimizerSettings::defaults_of(const std::string& name, double learning_rate) {
  OptimizerSettings s;
  s.name = name;
  s.learning_rate = learning_rate;
  if (name == "adamw_bf16") {
    s.beta1 = 0.9, s.beta2 = 0.999, s.epsilon = 1e-6, s.weight_decay = 1e-2;
  } else if (name == "torch-adamw") {
    s.beta1 = 0.9, s.beta2 = 0.999, s.epsilon = 1e-8, s.weight_decay = 1e-2;
  } else if (name == "optimi-lion") {
    s.beta1 = 0.9, s.beta2 = 0.99, s.weight_decay = 0.0;
  } else {
    throw_value_error("[optimizer] optimizer must be one of " + join(optimizer_names()) + ", got '" + name + "'");
  }
  return s;
}

OptimizerSettings optimizer_settings(const TrainConfig& config, std::vector<std::string>* warnings) {
  OptimizerSettings s = OptimizerSettings::defaults_of(config.optimizer, config.learning_rate);
  // The keyword arguments of each optimizer's constructor in SimpleTuner (the class it builds):
  // what its sanitiser keeps. Implementation switches that do not change the arithmetic are
  // accepted and have no effect here.
  const std::map<std::string, std::vector<std::string>> accepted = {
      {"adamw_bf16", {"lr", "betas", "eps", "weight_decay"}},
      {"torch-adamw", {"lr", "betas", "eps", "weight_decay", "amsgrad", "foreach", "maximize", "capturable",
                       "differentiable", "fused"}},
      {"optimi-lion", {"lr", "betas", "weight_decay", "decouple_lr", "max_lr", "kahan_sum", "foreach",
                       "gradient_release"}},
  };
  const auto& keys = accepted.at(s.name);
  const std::string& text = config.optimizer_config;
  std::vector<std::string> dropped;
  size_t start = 0;
  while (!text.empty() && start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) bad_config(text, "must be key=value pairs separated by commas");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      dropped.push_back(key);
      continue;
    }
    if (key == "lr") bad_config(text, "cannot set lr (use learning_rate)");
    if (key == "betas") bad_config(text, "cannot set betas (use optimizer_beta1 and optimizer_beta2)");
    if (key == "eps") s.epsilon = number_in(text, key, value);
    else if (key == "weight_decay") s.weight_decay = number_in(text, key, value);
    else if (key == "amsgrad") s.amsgrad = bool_in(text, key, value);
    else if (key == "decouple_lr") s.decouple_lr = bool_in(text, key, value);
    else if (key == "max_lr") s.max_lr = number_in(text, key, value);
    else if (key == "maximize" && bool_in(text, key, value)) bad_config(text, "maximize=true is not supported by remat");
  }
  if (s.epsilon < 0 || s.weight_decay < 0) bad_config(text, "eps and weight_decay must be >= 0");
  if (s.decouple_lr && !(s.max_lr && *s.max_lr > 0)) {
    bad_config(text, "decouple_lr=true needs max_lr > 0 (the largest scheduled learning rate)");
  }
  if (!dropped.empty() && warnings) {
    warnings->push_back("[train] optimizer_config: " + join(dropped) + " dropped (not taken by " + s.name +
                        ", as SimpleTuner drops them)");
  }
  if (config.optimizer_beta1 && config.optimizer_beta2) {
    s.beta1 = *config.optimizer_beta1;
    s.beta2 = *config.optimizer_beta2;
  } else if ((config.optimizer_beta1 || config.optimizer_beta2) && warnings) {
    warnings->push_back("[train] optimizer_beta1 and optimizer_beta2 are used only together (as in "
                        "SimpleTuner); ignoring the one given");
  }
  return s;
}

OptimizerSettings optimizer_settings(const torch::optim::Optimizer& optimizer) {
  if (const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer)) {
    OptimizerSettings s = zero->settings();  // the learning rate is the outer group's
    s.learning_rate = zero->param_groups().front().options().get_lr();
    return s;
  }
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamW*>(&optimizer)) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(adamw->param_groups().front().options());
    OptimizerSettings s;
    s.name = "torch-adamw";
    s.learning_rate = o.lr();
    s.beta1 = std::get<0>(o.betas());
    s.beta2 = std::get<1>(o.betas());
    s.epsilon = o.eps();
    s.weight_decay = o.weight_decay();
    s.amsgrad = o.amsgrad();
    return s;
  }
  if (const auto* own = dynamic_cast<const NamedStateOptimizer*>(&optimizer)) {
    OptimizerSettings s = own->settings();
    s.learning_rate = own->param_groups().front().options().get_lr();
    return s;
  }
  throw_value_error("[optimizer] this optimizer was not built by remat's make_optimizer");
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor>& parameters,
                                                        const OptimizerSettings& s) {
  if (s.name == "torch-adamw") {
    return std::make_unique<torch::optim::AdamW>(parameters, torch::optim::AdamWOptions(s.learning_rate)
                                                                 .betas({s.beta1, s.beta2})
                                                                 .eps(s.epsilon)
                                                                 .weight_decay(s.weight_decay)
                                                                 .amsgrad(s.amsgrad));
  }
  if (s.name == "adamw_bf16") return std::make_unique<AdamWBF16>(parameters, s);
  if (s.name == "optimi-lion") return std::make_unique<Lion>(parameters, s);
  throw_value_error("[optimizer] optimizer must be one of " + join(optimizer_names()) + ", got '" + s.name + "'");
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double learning_rate) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(learning_rate);
}

std::vector<std::pair<std::string, at::Tensor>> optimizer_state(
    torch::optim::Optimizer& optimizer, const std::vector<std::pair<std::string, at::Tensor>>& params) {
  // A sharded state saved from one rank would silently lose the other shards.
  TORCH_CHECK(dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer) == nullptr,
              "[optimizer] a ZeRO-1 optimizer's state is sharded across the ranks: call "
              "ZeroRedundancyOptimizer::gather_full_state on every rank instead of optimizer_state");
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (auto* adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
    auto& states = adamw->state();
    for (const auto& [name, p] : params) {
      auto it = states.find(compat::optimizer_state_key(states, p));
      if (it == states.end()) continue;
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      out.emplace_back(name + ".exp_avg", s.exp_avg());
      out.emplace_back(name + ".exp_avg_sq", s.exp_avg_sq());
      if (s.max_exp_avg_sq().defined()) out.emplace_back(name + ".max_exp_avg_sq", s.max_exp_avg_sq());
      out.emplace_back(name + ".step", torch::tensor(s.step(), torch::kLong));
    }
    return out;
  }
  auto* own = dynamic_cast<NamedStateOptimizer*>(&optimizer);
  TORCH_CHECK(own != nullptr, "[optimizer] this optimizer was not built by remat's make_optimizer");
  for (const auto& [name, p] : params) {
    if (const State* s = own->find(p)) {
      for (const auto& [field, tensor] : *s) out.emplace_back(name + "." + field, tensor);
    }
  }
  return out;
}

std::vector<std::string> optimizer_state_fields(torch::optim::Optimizer& optimizer) {
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer)) return optimizer_state_fields(zero->local_optimizer());
  if (auto* adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(adamw->param_groups().front().options());
    if (o.amsgrad()) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"};
    return {"exp_avg", "exp_avg_sq", "step"};
  }
  auto* own = dynamic_cast<NamedStateOptimizer*>(&optimizer);
  TORCH_CHECK(own != nullptr, "[optimizer] this optimizer was not built by remat's make_optimizer");
  return own->fields();
}

void restore_optimizer_state(torch::optim::Optimizer& optimizer,
                             const std::vector<std::pair<std::string, at::Tensor>>& params,
                             const std::vector<std::pair<std::string, at::Tensor>>& state) {
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer)) {
    zero->restore_full_state(params, state);  // keeps the owned tensors' state only
    return;
  }
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  const auto field = [&](const std::string& name, const std::string& f) -> const at::Tensor* {
    auto it = by_name.find(name + "." + f);
    return it == by_name.end() ? nullptr : &it->second;
  };
  if (auto* adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
    auto& states = adamw->state();
    for (const auto& [name, p] : params) {
      const at::Tensor* avg = field(name, "exp_avg");
      if (avg == nullptr) continue;  // never stepped when saved
      const at::Tensor* avg_sq = field(name, "exp_avg_sq");
      const at::Tensor* step = field(name, "step");
      TORCH_CHECK(avg_sq != nullptr && step != nullptr, "[checkpoint] optimizer state of '", name,
                  "' is incomplete (needs exp_avg, exp_avg_sq and step)");
      TORCH_CHECK(avg->sizes() == p.sizes() && avg_sq->sizes() == p.sizes(), "[checkpoint] optimizer state of '",
                  name, "' has shape ", avg->sizes(), ", the parameter has ", p.sizes());
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(step->item<int64_t>());
      s->exp_avg(avg->to(p.options()).clone());
      s->exp_avg_sq(avg_sq->to(p.options()).clone());
      if (const at::Tensor* max_sq = field(name, "max_exp_avg_sq")) s->max_exp_avg_sq(max_sq->to(p.options()).clone());
      states[compat::optimizer_state_key(states, p)] = std::move(s);
    }
    return;
  }
  auto* own = dynamic_cast<NamedStateOptimizer*>(&optimizer);
  TORCH_CHECK(own != nullptr, "[optimizer] this optimizer was not built by remat's make_optimizer");
  for (const auto& [name, p] : params) {
    const auto fields = own->fields();
    if (field(name, fields.front()) == nullptr) continue;  // never stepped when saved
    State s;
    for (const auto& f : fields) {
      const at::Tensor* t = field(name, f);
      TORCH_CHECK(t != nullptr, "[checkpoint] optimizer state of '", name, "' is incomplete (needs ",
                  join(fields), "), ", f, " is missing");
      TORCH_CHECK(t->dim() == 0 || t->sizes() == p.sizes(), "[checkpoint] optimizer state ", f, " of '", name,
                  "' has shape ", t->sizes(), ", the parameter has ", p.sizes());
      s[f] = t->dim() == 0 ? t->clone() : t->to(p.device()).clone();
    }
    own->set(p, std::move(s));
  }
}

bool optimizer_has_state(torch::optim::Optimizer& optimizer) {
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer)) return optimizer_has_state(zero->local_optimizer());
  if (auto* own = dynamic_cast<NamedStateOptimizer*>(&optimizer)) return !own->empty();
  return !optimizer.state().empty();
}

int64_t optimizer_state_bytes(const OptimizerSettings& settings, const std::vector<at::Tensor>& parameters) {
  int64_t elements = 0, bytes = 0;
  for (const auto& p : parameters) {
    elements += p.numel();
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  if (settings.name == "adamw_bf16") return 3 * 2 * elements;
  if (settings.name == "optimi-lion") return bytes;
  return (settings.amsgrad ? 3 : 2) * bytes;
}

}  // namespace remat::train
