// The optimizers of SimpleTuner's vocabulary: their settings as SimpleTuner assembles them, Lion
// against a float64 reference, AdamWBF16's arithmetic (bf16 weights, stochastic rounding, the
// compensation buffer), and gradient clipping by value and by norm.
#include <gtest/gtest.h>

#include <cmath>

#include <torch/torch.h>

#include "remat/train/options/config.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/run/step.h"
#include "remat/train/family/transformer.h"

namespace remat::train {
namespace {
namespace optimizer_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

class Optimizers : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(0); }
};

TrainConfig config_with(const std::string& optimizer, const std::string& optimizer_config = "") {
  TrainConfig c;
  c.optimizer = optimizer;
  c.learning_rate = 1e-3;
  c.optimizer_config = optimizer_config;
  return c;
}

TEST_F(Optimizers, SettingsAreSimpleTunersDefaultsThenOptimizerConfigThenBetas) {
  // optimizer_param.py default_settings of each.
  auto s = optimizer_settings(config_with("adamw_bf16"));
  EXPECT_EQ(s.beta1, 0.9);
  EXPECT_EQ(s.beta2, 0.999);
  EXPECT_EQ(s.epsilon, 1e-6);
  EXPECT_EQ(s.weight_decay, 1e-2);
  s = optimizer_settings(config_with("torch-adamw"));
  EXPECT_EQ(s.epsilon, 1e-8);
  EXPECT_EQ(s.weight_decay, 1e-2);
  s = optimizer_settings(config_with("optimi-lion"));
  EXPECT_EQ(s.beta2, 0.99);
  EXPECT_EQ(s.weight_decay, 0.0);

  // optimizer_config overrides (the two examples' "weight_decay=0.0,eps=1e-8").
  s = optimizer_settings(config_with("adamw_bf16", "weight_decay=0.0,eps=1e-8"));
  EXPECT_EQ(s.weight_decay, 0.0);
  EXPECT_EQ(s.epsilon, 1e-8);
  // Keys the optimizer does not take are dropped with a warning, as SimpleTuner's sanitiser does.
  std::vector<std::string> warnings;
  s = optimizer_settings(config_with("optimi-lion", "eps=1e-8,weight_decay=0.5,kahan_sum=true"), &warnings);
  EXPECT_EQ(s.weight_decay, 0.5);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("eps dropped (not taken by optimi-lion"), std::string::npos) << warnings[0];

  // optimizer_beta1/2 apply only together.
  TrainConfig both = config_with("torch-adamw");
  both.optimizer_beta1 = 0.8;
  both.optimizer_beta2 = 0.95;
  s = optimizer_settings(both);
  EXPECT_EQ(s.beta1, 0.8);
  EXPECT_EQ(s.beta2, 0.95);
  TrainConfig one = config_with("torch-adamw");
  one.optimizer_beta1 = 0.8;
  warnings.clear();
  s = optimizer_settings(one, &warnings);
  EXPECT_EQ(s.beta1, 0.9);
  EXPECT_EQ(warnings.size(), 1u);

  for (const auto& [bad, text] : std::vector<std::pair<std::string, std::string>>{
           {"lr=1e-3", "cannot set lr"},
           {"weight_decay=abc", "weight_decay must be a number"},
           {"maximize=true", "maximize=true is not supported"},
           {"weight_decay", "key=value pairs"}}) {
    try {
      optimizer_settings(config_with("torch-adamw", bad));
      ADD_FAILURE() << bad;
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.option(), "optimizer_config");
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  }
  try {
    optimizer_settings(config_with("optimi-lion", "decouple_lr=true"));
    ADD_FAILURE();
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("needs max_lr"), std::string::npos) << e.what();
  }
  try {
    OptimizerSettings::defaults_of("prodigy", 1e-3);
    ADD_FAILURE();
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("one of adamw_bf16, torch-adamw, optimi-lion, got 'prodigy'"),
              std::string::npos);
  }
}

TEST_F(Optimizers, TorchAdamWIsLibTorchsAdamW) {
  const at::Tensor start = torch::randn({4, 5});
  at::Tensor a = start.clone().requires_grad_(true), b = start.clone().requires_grad_(true);
  auto ours = make_optimizer({a}, OptimizerSettings::defaults_of("torch-adamw", 1e-2));
  torch::optim::AdamW reference({b}, torch::optim::AdamWOptions(1e-2).weight_decay(1e-2).eps(1e-8));
  for (int i = 0; i < 5; ++i) {
    const at::Tensor g = torch::randn({4, 5});
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    ours->step();
    reference.step();
  }
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_EQ(optimizer_settings(*ours).name, "torch-adamw");
}

// optimi's Lion, written out in float64: p *= 1 - lr * wd (or 1 - lr / max_lr * wd);
// u = sign(m + (1 - b1)(g - m)); m += (1 - b2)(g - m); p -= lr * u.
TEST_F(Optimizers, LionMatchesAFloat64Reference) {
  for (const bool decouple : {false, true}) {
    OptimizerSettings s = OptimizerSettings::defaults_of("optimi-lion", 3e-3);
    s.weight_decay = 0.1;
    s.decouple_lr = decouple;
    s.max_lr = 6e-3;
    const at::Tensor start = torch::randn({64});
    at::Tensor p = start.clone().requires_grad_(true);
    auto lion = make_optimizer({p}, s);
    at::Tensor ref = start.to(at::kDouble), m = at::zeros({64}, at::kDouble);
    const std::vector<double> rates = {3e-3, 2e-3, 1e-3, 3e-3, 5e-4, 1e-3};
    for (double lr : rates) {
      set_learning_rate(*lion, lr);
      const at::Tensor g = torch::randn({64});
      p.mutable_grad() = g.clone();
      lion->step();
      const at::Tensor gd = g.to(at::kDouble);
      ref = ref * (decouple ? 1.0 - lr / 6e-3 * 0.1 : 1.0 - lr * 0.1);
      const at::Tensor u = (m + (1.0 - s.beta1) * (gd - m)).sign();
      m = m + (1.0 - s.beta2) * (gd - m);
      ref = ref - lr * u;
    }
    const double max_diff = (p.detach().to(at::kDouble) - ref).abs().max().item<double>();
    EXPECT_TRUE(torch::allclose(p.detach().to(at::kDouble), ref, /*rtol=*/1e-6, /*atol=*/1e-7))
        << "decouple_lr " << decouple << ", max diff " << max_diff;
  }
}

bool bf16_exact(const at::Tensor& t) { return torch::equal(t, t.to(at::kBFloat16).to(t.scalar_type())); }

TEST_F(Optimizers, AdamWBF16KeepsBf16WeightsAndIsDeterministicPerSeed) {
  const at::Tensor start = torch::randn({32, 16});
  const at::Tensor grads = torch::randn({6, 32, 16});
  const auto run = [&](uint64_t seed) {
    torch::manual_seed(seed);
    at::Tensor p = start.clone().requires_grad_(true);
    auto opt = make_optimizer({p}, OptimizerSettings::defaults_of("adamw_bf16", 1e-2));
    for (int64_t i = 0; i < grads.size(0); ++i) {
      p.mutable_grad() = grads[i].clone();
      opt->step();
      EXPECT_TRUE(bf16_exact(p.detach())) << "step " << i;
    }
    return p.detach().clone();
  };
  const at::Tensor a = run(1), b = run(1), c = run(2);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::equal(a, c));  // the rounding is random
  EXPECT_FALSE(torch::equal(a, start.to(at::kBFloat16).to(at::kFloat)));
}

// The first step from zero state: m = g (exact, g is bf16), v = bf16((1 - b2) g^2), and the
// update -lr * sqrt(1 - b2) * m / (sqrt(v) + eps) reaches the weights through two stochastic
// roundings, so its mean over many seeds is the exact update. Weight decay 0 here.
TEST_F(Optimizers, AdamWBF16FirstStepIsUnbiased) {
  const double lr = 1e-3, b2 = 0.999, eps = 1e-6;
  const at::Tensor p0 = torch::randn({256}).to(at::kBFloat16).to(at::kFloat);
  const at::Tensor g = torch::randn({256}).to(at::kBFloat16).to(at::kFloat);
  at::Tensor sum = at::zeros({256}, at::kDouble);
  const int trials = 400;
  for (int t = 0; t < trials; ++t) {
    torch::manual_seed(100 + t);
    at::Tensor p = p0.clone().requires_grad_(true);
    OptimizerSettings s = OptimizerSettings::defaults_of("adamw_bf16", lr);
    s.weight_decay = 0.0;
    auto opt = make_optimizer({p}, s);
    p.mutable_grad() = g.clone();
    opt->step();
    sum += (p.detach() - p0).to(at::kDouble);
  }
  const at::Tensor v = ((1.0 - b2) * g.to(at::kBFloat16).to(at::kFloat) * g.to(at::kBFloat16).to(at::kFloat))
                           .to(at::kBFloat16);
  const at::Tensor denom = v.sqrt().add(eps).to(at::kDouble);
  const at::Tensor expected = -lr * std::sqrt(1.0 - b2) * g.to(at::kDouble) / denom;
  const at::Tensor mean = sum / trials;
  // One bf16 ulp of the weights is ~ |p| / 128; the mean of 400 draws is within a few % of it.
  const at::Tensor tolerance = p0.abs().to(at::kDouble) / 128.0 * 0.15 + 2e-6;
  const at::Tensor excess = ((mean - expected).abs() - tolerance).max();
  EXPECT_LE(excess.item<double>(), 0.0) << "max |mean - expected| = " << (mean - expected).abs().max().item<double>();
}

// Updates far below bf16's resolution still add up (the shift buffer and stochastic rounding),
// where rounding to nearest would never move the weight.
TEST_F(Optimizers, AdamWBF16AccumulatesSubUlpUpdates) {
  OptimizerSettings s = OptimizerSettings::defaults_of("adamw_bf16", 1e-4);
  s.weight_decay = 0.0;
  at::Tensor p = at::ones({512}).requires_grad_(true);  // ulp at 1.0 is 2^-7 = 0.0078
  auto opt = make_optimizer({p}, s);
  const int steps = 300;
  for (int i = 0; i < steps; ++i) {
    p.mutable_grad() = at::ones({512});  // constant gradient: every update is ~ -lr
    opt->step();
  }
  // Each update is ~lr = 1e-4 (a little more: the moment settles at 1 / (1 - 0.09)), an 80th of
  // the ulp: rounding to nearest would leave every weight at 1.
  const double moved = 1.0 - p.detach().mean().item<double>();
  EXPECT_GT(moved, 0.7 * steps * 1e-4) << "moved " << moved;
  EXPECT_LT(moved, 1.4 * steps * 1e-4) << "moved " << moved;
}

// SimpleTuner's add_stochastic_ computes other + alpha * input, so its first moment is
// m = g + (1 - b1) * b1 * m (not b1 m + (1 - b1) g). With b1 = 0.5 and g = 1 every value is exact
// in bf16: m1 = 1, m2 = 1 + 0.5 * 0.5 = 1.25.
TEST_F(Optimizers, AdamWBF16FirstMomentAsSimpleTunerComputesIt) {
  OptimizerSettings s = OptimizerSettings::defaults_of("adamw_bf16", 1e-3);
  s.beta1 = 0.5;
  at::Tensor p = at::ones({8}).requires_grad_(true);
  auto opt = make_optimizer({p}, s);
  const std::vector<std::pair<std::string, at::Tensor>> named{{"p", p}};
  for (const double want : {1.0, 1.25, 1.3125}) {
    p.mutable_grad() = at::ones({8});
    opt->step();
    for (const auto& [name, tensor] : optimizer_state(*opt, named)) {
      if (name == "p.exp_avg") {
        EXPECT_TRUE(torch::allclose(tensor.to(at::kFloat), at::full({8}, want))) << want;
      }
    }
  }
}

// grad_clip_method: value clamps every element to +-max_grad_norm (clip_grad_value_), norm scales
// all gradients by max_norm / (||g|| + 1e-6) when the global norm is larger (clip_grad_norm_).
TEST_F(Optimizers, GradientClippingByValueAndByNorm) {
  TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = "flux-tiny";
  auto model = make_transformer(spec, at::Device(at::kCPU));
  const at::Tensor g1 = torch::tensor({3.0, -0.5, 0.25, -4.0});
  const at::Tensor g2 = torch::tensor({1.0, -2.0});
  for (const bool by_value : {true, false}) {
    at::Tensor a = torch::zeros({4}).requires_grad_(true), b = torch::zeros({2}).requires_grad_(true);
    a.mutable_grad() = g1.clone();
    b.mutable_grad() = g2.clone();
    auto opt = make_optimizer({a, b}, OptimizerSettings::defaults_of("torch-adamw", 1e-3));
    StepSettings settings;
    settings.max_grad_norm = 1.0;
    settings.clip_by_value = by_value;
    TrainingStep step(*model, *opt, {a, b}, settings);
    const double norm = step.clip_gradients().item<double>();
    const double total = std::sqrt(9.0 + 0.25 + 0.0625 + 16.0 + 1.0 + 4.0);
    EXPECT_NEAR(norm, total, 1e-5);  // measured before clipping either way
    if (by_value) {
      EXPECT_TRUE(torch::equal(a.grad(), torch::tensor({1.0f, -0.5f, 0.25f, -1.0f})));
      EXPECT_TRUE(torch::equal(b.grad(), torch::tensor({1.0f, -1.0f})));
    } else {
      const double scale = 1.0 / (total + 1e-6);
      EXPECT_TRUE(torch::allclose(a.grad(), g1 * scale, 1e-6, 1e-7));
      EXPECT_TRUE(torch::allclose(b.grad(), g2 * scale, 1e-6, 1e-7));
    }
  }
}

TEST_F(Optimizers, StateBytes) {
  const std::vector<at::Tensor> params{torch::zeros({10, 10}), torch::zeros({5})};
  EXPECT_EQ(optimizer_state_bytes(OptimizerSettings::defaults_of("torch-adamw", 1e-3), params), 2 * 105 * 4);
  EXPECT_EQ(optimizer_state_bytes(OptimizerSettings::defaults_of("adamw_bf16", 1e-3), params), 3 * 105 * 2);
  EXPECT_EQ(optimizer_state_bytes(OptimizerSettings::defaults_of("optimi-lion", 1e-3), params), 105 * 4);
}

}  // namespace optimizer_test
}  // namespace
}  // namespace remat::train
