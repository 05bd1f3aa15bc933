// ExponentialMovingAverage against a float64 recurrence written from SimpleTuner's EMAModel
// (helpers/training/ema.py: get_decay and step), its fused and per-tensor updates against each
// other, the swap used for validation and saving, and its checkpoint state.
#include <cmath>
#include <iostream>
#include <map>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/memory.h"
#include "remat/train/options/config.h"
#include "remat/train/run/ema.h"

namespace remat::train {
namespace {
namespace ema_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

// EMAModel.get_decay(optimization_step) with decay, min_decay 0, update_after_step 0,
// use_ema_warmup false and warmup_steps, transcribed from the Python.
double simpletuner_get_decay(double decay, int64_t warmup_steps, int64_t optimization_step) {
  const int64_t step = std::max<int64_t>(0, optimization_step - 0 - 1);
  if (warmup_steps > 0) return optimization_step < warmup_steps ? 0.0 : decay;
  if (step <= 0) return 0.0;
  double cur = (1.0 + step) / (10.0 + step);
  cur = std::min(cur, decay);
  return std::max(cur, 0.0);
}

ExponentialMovingAverage::NamedParameters random_parameters(at::ScalarType dtype = at::kFloat) {
  torch::manual_seed(7);
  return {{"a.weight", torch::randn({5, 3}).to(dtype)},
          {"a.bias", torch::randn({5}).to(dtype)},
          {"b.lora_A", torch::randn({2, 8}).to(dtype)}};
}

// The trainer's order: an optimizer step changes the weights, then the average follows.
void perturb(ExponentialMovingAverage::NamedParameters& params, int64_t step) {
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params) p.add_(torch::randn_like(p) * 0.1 * static_cast<double>(step % 3 + 1));
}

// Training steps first..last (perturb), each followed by the update of the average.
void train(ExponentialMovingAverage& ema, ExponentialMovingAverage::NamedParameters& params, int64_t first,
           int64_t last) {
  for (int64_t step = first; step <= last; ++step) {
    perturb(params, step);
    ema.step(step);
  }
}

EmaSettings with_decay(double decay) {
  EmaSettings s;
  s.decay = decay;
  return s;
}

TEST(Ema, DecayIsSimpleTunersGetDecay) {
  for (double decay : {0.0, 0.5, 0.995, 0.9999}) {
    for (int64_t warmup : {0, 1, 4}) {
      EmaSettings s;
      s.decay = decay;
      s.warmup_steps = warmup;
      for (int64_t step = 1; step <= 2000; step += (step < 30 ? 1 : 97)) {
        EXPECT_EQ(ema_decay_at(s, step), simpletuner_get_decay(decay, warmup, step))
            << "decay " << decay << " warmup " << warmup << " step " << step;
      }
    }
  }
  EmaSettings s;
  EXPECT_EQ(ema_decay_at(s, 1), 0.0);                 // the first update copies the weights
  EXPECT_DOUBLE_EQ(ema_decay_at(s, 2), 2.0 / 11.0);   // then (1 + n) / (10 + n), n = step - 1
  EXPECT_EQ(ema_decay_at(s, 100000), 0.995);          // capped at ema_decay
}

// After N steps (updates every `interval`-th, with and without copy-through warm-up) the average
// equals the recurrence s = s - (1 - d)(s - p) computed in float64 from the same weights.
TEST(Ema, EqualsAFloat64RecurrenceAfterNSteps) {
  for (int64_t interval : {1, 3}) {
    for (int64_t warmup : {0, 4}) {
      auto params = random_parameters();
      EmaSettings s;
      s.decay = 0.9;
      s.update_interval = interval;
      s.warmup_steps = warmup;
      ExponentialMovingAverage ema(params, s, at::Device(at::kCPU));
      std::vector<at::Tensor> reference;
      for (const auto& [name, p] : params) reference.push_back(p.to(at::kDouble));
      for (int64_t step = 1; step <= 25; ++step) {
        perturb(params, step);
        const bool updated = ema.step(step);
        EXPECT_EQ(updated, step % interval == 0) << step;
        if (step % interval != 0) continue;
        const double d = simpletuner_get_decay(0.9, warmup, step);
        for (size_t i = 0; i < params.size(); ++i) {
          reference[i] = reference[i] - (1.0 - d) * (reference[i] - params[i].second.to(at::kDouble));
        }
        EXPECT_EQ(ema.last_decay(), d);
        EXPECT_EQ(ema.optimization_step(), step);
      }
      std::map<std::string, std::string> metadata;
      const auto state = ema.state(&metadata);
      ASSERT_EQ(state.size(), params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(state[i].first, params[i].first);
        EXPECT_EQ(state[i].second.scalar_type(), at::kFloat);
        EXPECT_TRUE(torch::allclose(state[i].second.to(at::kDouble), reference[i], 1e-6, 1e-6))
            << params[i].first << " interval " << interval << " warmup " << warmup << ": max diff "
            << (state[i].second.to(at::kDouble) - reference[i]).abs().max().item<double>();
        // The average is not just the weights.
        EXPECT_FALSE(torch::allclose(state[i].second, params[i].second, 1e-3, 1e-3)) << params[i].first;
      }
      EXPECT_EQ(metadata.at("optimization_step"), std::to_string(25 - 25 % interval));
    }
  }
}

// ema_foreach_disable changes the kernel, not the values: the two updates agree bit for bit.
TEST(Ema, FusedAndPerTensorUpdatesAgreeBitwise) {
  auto params_a = random_parameters(), params_b = random_parameters();
  EmaSettings fused, loop;
  fused.decay = loop.decay = 0.95;
  loop.foreach = false;
  ExponentialMovingAverage a(params_a, fused, at::Device(at::kCPU)), b(params_b, loop, at::Device(at::kCPU));
  for (int64_t step = 1; step <= 12; ++step) {
    torch::manual_seed(100 + step);
    perturb(params_a, step);
    torch::manual_seed(100 + step);
    perturb(params_b, step);
    a.step(step);
    b.step(step);
  }
  const auto sa = a.state(nullptr), sb = b.state(nullptr);
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(torch::equal(sa[i].second, sb[i].second)) << sa[i].first;
}

// The update needs no tensor-sized memory when the average and the weights are float32 on one
// device: both the fused update and the per-tensor one work in place. The tracking allocator's
// peak rises only by the scalar wrappers of d and 1 - d (bytes), where SimpleTuner's
// s - (1 - d)(s - p) holds a temporary of every tensor's size (16 KiB for the largest here).
TEST(Ema, UpdatesInPlace) {
  for (const bool foreach : {true, false}) {
    torch::manual_seed(1);
    ExponentialMovingAverage::NamedParameters params{{"w", torch::randn({64, 64})}, {"b", torch::randn({64})}};
    EmaSettings s = with_decay(0.9);
    s.foreach = foreach;
    ExponentialMovingAverage ema(params, s, at::Device(at::kCPU));
    train(ema, params, 1, 2);
    perturb(params, 3);
    const int64_t before = memory::current_bytes();
    memory::reset_peak();
    ASSERT_TRUE(ema.step(3));
    const int64_t rise = memory::peak_bytes() - before;
    EXPECT_LT(rise, 64) << (foreach ? "fused" : "per tensor");
    std::cout << "[ figures  ] " << (foreach ? "fused" : "per-tensor") << " update: peak rise " << rise << " B\n";
  }
}

// bfloat16 weights (adamw_bf16) are averaged in float32: updates smaller than bf16's spacing count.
TEST(Ema, AveragesBfloat16WeightsInFloat32) {
  auto params = random_parameters(at::kBFloat16);
  EmaSettings s;
  s.decay = 0.999;
  ExponentialMovingAverage ema(params, s, at::Device(at::kCPU));
  std::vector<at::Tensor> reference;
  for (const auto& [name, p] : params) reference.push_back(p.to(at::kDouble));
  for (int64_t step = 1; step <= 40; ++step) {
    perturb(params, step);
    ema.step(step);
    const double d = simpletuner_get_decay(0.999, 0, step);
    for (size_t i = 0; i < params.size(); ++i) {
      reference[i] = reference[i] - (1.0 - d) * (reference[i] - params[i].second.to(at::kDouble));
    }
  }
  const auto state = ema.state(nullptr);
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(state[i].second.scalar_type(), at::kFloat);
    EXPECT_TRUE(torch::allclose(state[i].second.to(at::kDouble), reference[i], 1e-6, 1e-6)) << state[i].first;
  }
  EXPECT_EQ(ema.bytes(), (15 + 5 + 16) * 4);
}

// The swap puts the average in the parameters and the trained values back, exactly.
TEST(Ema, SwapShowsTheAverageAndRestoresTheWeights) {
  auto params = random_parameters();
  ExponentialMovingAverage ema(params, with_decay(0.9), at::Device(at::kCPU));
  train(ema, params, 1, 5);
  std::vector<at::Tensor> trained;
  for (const auto& [name, p] : params) trained.push_back(p.clone());
  const auto average = ema.state(nullptr);
  {
    const ExponentialMovingAverage::Swap swap(ema);
    for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i].second, average[i].second));
  }
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i].second, trained[i]));
}

// What a checkpoint holds restores the average and the schedule exactly.
TEST(Ema, StateRestoresTheAverageAndTheStep) {
  auto params = random_parameters();
  const EmaSettings s = with_decay(0.9);
  ExponentialMovingAverage ema(params, s, at::Device(at::kCPU));
  train(ema, params, 1, 7);
  std::map<std::string, std::string> metadata;
  std::vector<io::NamedTensor> saved;
  for (auto& [name, t] : ema.state(&metadata)) saved.emplace_back(name, t.clone());
  EXPECT_EQ(metadata.at("decay"), "0.9");

  ExponentialMovingAverage restored(params, s, at::Device(at::kCPU));  // starts at the weights
  restored.load_state(saved, metadata);
  EXPECT_EQ(restored.optimization_step(), 7);
  EXPECT_EQ(restored.last_decay(), ema.last_decay());
  for (int64_t step = 8; step <= 10; ++step) {
    perturb(params, step);
    ema.step(step);
    restored.step(step);
  }
  const auto a = ema.state(nullptr), b = restored.state(nullptr);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;

  restored.restart();
  EXPECT_EQ(restored.optimization_step(), 0);
  const auto c = restored.state(nullptr);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_TRUE(torch::equal(c[i].second, params[i].second)) << c[i].first;
}

TEST(Ema, SettingsFollowTheOptions) {
  TrainConfig config;
  config.use_ema = true;
  config.ema_decay = 0.99;
  config.ema_update_interval = 4;
  config.ema_warmup_steps = 2;
  config.ema_foreach_disable = true;
  config.ema_device = "accelerator";
  EmaSettings s = ema_settings(config);
  EXPECT_EQ(s.decay, 0.99);
  EXPECT_EQ(s.update_interval, 4);
  EXPECT_EQ(s.warmup_steps, 2);
  EXPECT_FALSE(s.foreach);
  EXPECT_TRUE(s.on_training_device);
  config.ema_cpu_only = true;  // SimpleTuner: ema_cpu_only means ema_device cpu
  s = ema_settings(config);
  EXPECT_FALSE(s.on_training_device);
  EXPECT_TRUE(s.cpu_only);
}

}  // namespace ema_test
}  // namespace
}  // namespace remat::train
