// The Flux sampling schedule against diffusers' published formulas evaluated here in float64
// (calculate_shift, the exponential / linear / constant shifts, the Euler step), and against the
// float32 values diffusers' own FluxPipeline produced (recorded from one run on a tiny pipeline:
// H=64, W=48, 4 steps, guidance 3.5, seed 7, CPU generator, FLUX.1-dev's scheduler config).

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/sample/scheduler.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::sample {
namespace {
namespace scheduler_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;

// numpy.linspace(1, 1/N, N), the sigmas FluxPipeline passes (float64).
std::vector<double> pipeline_sigmas(int64_t n) {
  std::vector<double> s;
  for (int64_t i = 0; i < n; ++i) s.push_back(n == 1 ? 1.0 : 1.0 + i * (1.0 / n - 1.0) / (n - 1));
  return s;
}

double mu_formula(double seq_len, double base_seq, double max_seq, double base_shift, double max_shift) {
  const double m = (max_shift - base_shift) / (max_seq - base_seq);
  return seq_len * m + (base_shift - m * base_seq);
}

// The float32 schedule against `shifted` (float64) at relative precision float32 allows.
void expect_schedule(const FlowMatchSchedule& schedule, const std::vector<double>& shifted) {
  const int64_t n = static_cast<int64_t>(shifted.size());
  ASSERT_EQ(schedule.sigmas.scalar_type(), at::kFloat);
  ASSERT_EQ(schedule.timesteps.scalar_type(), at::kFloat);
  ASSERT_EQ(schedule.sigmas.numel(), n + 1);
  ASSERT_EQ(schedule.timesteps.numel(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double sigma = schedule.sigmas[i].item<float>();
    EXPECT_NEAR(sigma, shifted[i], 4e-7 * shifted[i]) << "sigma " << i;
    EXPECT_NEAR(schedule.timesteps[i].item<float>(), shifted[i] * 1000.0, 1e-3) << "timestep " << i;
    EXPECT_GT(sigma, schedule.sigmas[i + 1].item<float>()) << "decreasing at " << i;
  }
  EXPECT_EQ(schedule.sigmas[n].item<float>(), 0.0f);
}

TEST(SchedulerTest, CalculateShiftIsTheLineThroughBaseAndMax) {
  const auto dev = FlowMatchSchedulerConfig::flux_dev();
  for (int64_t seq : {1, 12, 256, 1000, 4096, 16384}) {
    EXPECT_DOUBLE_EQ(calculate_shift(seq, dev), mu_formula(seq, 256, 4096, 0.5, 1.15)) << seq;
  }
  EXPECT_DOUBLE_EQ(calculate_shift(256, dev), 0.5);
  EXPECT_DOUBLE_EQ(calculate_shift(4096, dev), 1.15);
  FlowMatchSchedulerConfig other = dev;
  other.base_shift = 0.25;
  other.max_shift = 2.0;
  other.base_image_seq_len = 64;
  other.max_image_seq_len = 1024;
  EXPECT_DOUBLE_EQ(calculate_shift(500, other), mu_formula(500, 64, 1024, 0.25, 2.0));
  // The recorded FluxPipeline run (64 x 48 pixels): 12 image tokens.
  EXPECT_DOUBLE_EQ(calculate_shift(12, dev), 0.45869791666666665);
}

TEST(SchedulerTest, DynamicExponentialShiftMatchesTheFormula) {
  const auto dev = FlowMatchSchedulerConfig::flux_dev();
  for (int64_t steps : {1, 4, 28, 50}) {
    for (int64_t seq : {12, 1024, 4096}) {
      const double mu = mu_formula(seq, 256, 4096, 0.5, 1.15);
      std::vector<double> shifted;
      for (double s : pipeline_sigmas(steps)) shifted.push_back(std::exp(mu) / (std::exp(mu) + (1.0 / s - 1.0)));
      SCOPED_TRACE("steps " + std::to_string(steps) + " seq " + std::to_string(seq));
      expect_schedule(flow_match_schedule(dev, steps, seq), shifted);
    }
  }
}

TEST(SchedulerTest, DynamicLinearShiftMatchesTheFormula) {
  auto config = FlowMatchSchedulerConfig::flux_dev();
  config.time_shift_type = "linear";
  const int64_t seq = 2048, steps = 20;
  const double mu = mu_formula(seq, 256, 4096, 0.5, 1.15);
  std::vector<double> shifted;
  for (double s : pipeline_sigmas(steps)) shifted.push_back(mu / (mu + (1.0 / s - 1.0)));
  expect_schedule(flow_match_schedule(config, steps, seq), shifted);
}

TEST(SchedulerTest, ConstantShiftMatchesTheFormulaAndIgnoresTheSequenceLength) {
  FlowMatchSchedulerConfig config;
  config.shift = 3.0;
  config.use_dynamic_shifting = false;
  const int64_t steps = 10;
  std::vector<double> shifted;
  for (double s : pipeline_sigmas(steps)) shifted.push_back(3.0 * s / (1.0 + 2.0 * s));
  expect_schedule(flow_match_schedule(config, steps, 16), shifted);
  EXPECT_TRUE(
      at::equal(flow_match_schedule(config, steps, 16).sigmas, flow_match_schedule(config, steps, 4096).sigmas));
}

TEST(SchedulerTest, SchnellLeavesTheSigmasUnshifted) {
  const auto schnell = FlowMatchSchedulerConfig::flux_schnell();
  const auto schedule = flow_match_schedule(schnell, 4, 4096);
  const std::vector<float> expected = {1.0f, 0.75f, 0.5f, 0.25f, 0.0f};
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(schedule.sigmas[i].item<float>(), expected[i]) << i;
}

TEST(SchedulerTest, WorkedExampleOfDiffusersFluxPipelineIsBitExact) {
  // The recorded FluxPipeline run: H=64, W=48 -> 12 image tokens, 4 steps, FLUX.1-dev's
  // scheduler config.
  const auto schedule = flow_match_schedule(FlowMatchSchedulerConfig::flux_dev(), 4, 12);
  const std::vector<float> sigmas = {1.0f, 0.825967013835907f, 0.6127052903175354f, 0.3452659249305725f, 0.0f};
  const std::vector<float> timesteps = {1000.0f, 825.967041015625f, 612.7052612304688f, 345.26593017578125f};
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(schedule.sigmas[i].item<float>(), sigmas[i]) << "sigma " << i;
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(schedule.timesteps[i].item<float>(), timesteps[i]) << "timestep " << i;
}

TEST(SchedulerTest, EulerStepIsSamplePlusDtTimesVelocity) {
  torch::manual_seed(3);
  const auto schedule = flow_match_schedule(FlowMatchSchedulerConfig::flux_dev(), 5, 64);
  const at::Tensor sample = torch::randn({1, 64, 16});
  const at::Tensor velocity = torch::randn({1, 64, 16});
  for (int64_t i = 0; i < schedule.steps(); ++i) {
    const double dt = static_cast<double>(schedule.sigmas[i + 1].item<float>()) - schedule.sigmas[i].item<float>();
    const at::Tensor expected = sample.to(at::kDouble) + dt * velocity.to(at::kDouble);
    const at::Tensor got = flow_match_euler_step(sample, velocity, schedule, i);
    ASSERT_EQ(got.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::allclose(got.to(at::kDouble), expected, 0, 1e-6)) << "step " << i;
  }
  // The last step lands on sigma 0: x0 = x - sigma_last v.
  const int64_t last = schedule.steps() - 1;
  const at::Tensor x0 = sample.to(at::kDouble) - schedule.sigmas[last].item<float>() * velocity.to(at::kDouble);
  EXPECT_TRUE(at::allclose(flow_match_euler_step(sample, velocity, schedule, last).to(at::kDouble), x0, 0, 1e-6));
}

TEST(SchedulerTest, EulerStepReturnsTheVelocityDtype) {
  const auto schedule = flow_match_schedule(FlowMatchSchedulerConfig::flux_dev(), 2, 64);
  const at::Tensor sample = torch::randn({4, 8}, at::kBFloat16);
  const at::Tensor velocity = torch::randn({4, 8}, at::kBFloat16);
  const at::Tensor got = flow_match_euler_step(sample, velocity, schedule, 0);
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  // bf16 rounding of dt * v (PyTorch promotion with a 0-dim float32 dt), a float32 sum, bf16 result.
  const at::Tensor dt = (schedule.sigmas[1] - schedule.sigmas[0]).to(at::kBFloat16);
  const at::Tensor expected = (sample.to(at::kFloat) + (dt * velocity).to(at::kFloat)).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(got, expected));
}

TEST(SchedulerTest, ConfigFromJsonReadsDiffusersFiles) {
  const auto dev = FlowMatchSchedulerConfig::from_json_string(R"({
    "_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.30.0.dev0",
    "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
    "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": true})");
  EXPECT_TRUE(dev.use_dynamic_shifting);
  EXPECT_EQ(dev.shift, 3.0);
  EXPECT_EQ(dev.max_image_seq_len, 4096);
  EXPECT_EQ(dev.time_shift_type, "exponential");
  // FLUX.1-schnell's file.
  const auto schnell = FlowMatchSchedulerConfig::from_json_string(R"({
    "_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.29.0.dev0",
    "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
    "num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": false})");
  EXPECT_FALSE(schnell.use_dynamic_shifting);
  EXPECT_EQ(schnell.shift, 1.0);
  const auto linear = FlowMatchSchedulerConfig::from_json_string(
      R"({"use_dynamic_shifting": true, "time_shift_type": "linear", "shift_terminal": null})");
  EXPECT_EQ(linear.time_shift_type, "linear");

  remat::testing::TempDir dir;
  const std::string path = dir / "scheduler_config.json";
  std::ofstream(path) << R"({"shift": 2.5})";
  EXPECT_EQ(FlowMatchSchedulerConfig::from_json_file(path).shift, 2.5);
}

TEST(SchedulerTest, BadConfigsAreRefusedNamingTheKey) {
  auto parse = [](const std::string& json) {
    return error_of([&] { FlowMatchSchedulerConfig::from_json_string(json); });
  };
  EXPECT_NE(parse(R"({"shift": "3"})").find("'shift'"), std::string::npos);
  EXPECT_NE(parse(R"({"use_karras_sigmas": true})").find("use_karras_sigmas"), std::string::npos);
  EXPECT_NE(parse(R"({"stochastic_sampling": true})").find("stochastic_sampling"), std::string::npos);
  EXPECT_NE(parse(R"({"shift_terminal": 0.1})").find("shift_terminal"), std::string::npos);
  EXPECT_NE(parse(R"({"time_shift_type": "cosine"})").find("cosine"), std::string::npos);
  EXPECT_NE(parse(R"({"base_image_seq_len": 4096})").find("base_image_seq_len"), std::string::npos);
  EXPECT_NE(parse(R"({"shift": -1})").find("shift"), std::string::npos);
  EXPECT_NE(parse("[1, 2]").find("[scheduler]"), std::string::npos);
  remat::testing::TempDir dir;
  EXPECT_NE(error_of([&] { FlowMatchSchedulerConfig::from_json_file(dir / "missing.json"); }).find("missing.json"),
            std::string::npos);
}

TEST(SchedulerTest, WrongTypesNameTheKey) {
  auto parse = [](const std::string& json) {
    return error_of([&] { FlowMatchSchedulerConfig::from_json_string(json); });
  };
  EXPECT_EQ(parse(R"({"num_train_timesteps": 1000.5})"),
            "[scheduler] config JSON: config key 'num_train_timesteps' must be an integer (64-bit), got 1000.5\n");
  EXPECT_EQ(parse(R"({"use_dynamic_shifting": "true"})"),
            "[scheduler] config JSON: config key 'use_dynamic_shifting' must be a boolean, got \"true\"\n");
  EXPECT_EQ(parse(R"({"max_shift": null, "base_shift": [0.5]})"),
            "[scheduler] config JSON: config key 'base_shift' must be a number, got [0.5]\n");
  EXPECT_EQ(parse(R"({"time_shift_type": 1})"),
            "[scheduler] config JSON: config key 'time_shift_type' must be a string, got 1\n");
  EXPECT_EQ(parse(R"({"use_beta_sigmas": 0})"),
            "[scheduler] config JSON: config key 'use_beta_sigmas' must be a boolean, got 0\n");
  // Null keeps the default, false is Flux's value.
  const auto c = FlowMatchSchedulerConfig::from_json_string(
      R"({"shift": null, "use_karras_sigmas": false, "shift_terminal": null, "time_shift_type": "linear"})");
  EXPECT_EQ(c.shift, 1.0);
  EXPECT_EQ(c.time_shift_type, "linear");
}

TEST(SchedulerTest, BadArgumentsAreRefused) {
  const auto dev = FlowMatchSchedulerConfig::flux_dev();
  EXPECT_NE(error_of([&] { flow_match_schedule(dev, 0, 64); }).find("num_inference_steps"), std::string::npos);
  EXPECT_NE(error_of([&] { flow_match_schedule(dev, 4, 0); }).find("image_seq_len"), std::string::npos);
  const auto schedule = flow_match_schedule(dev, 2, 64);
  const at::Tensor x = torch::zeros({2, 2});
  EXPECT_NE(error_of([&] { flow_match_euler_step(x, x, schedule, 2); }).find("step_index"), std::string::npos);
}

}  // namespace scheduler_test
}  // namespace
}  // namespace remat::sample
