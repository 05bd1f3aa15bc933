// Learning-rate schedules and flow-matching sigmas against their closed-form formulas, computed
// here in double precision.
#include <gtest/gtest.h>

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "remat/train/config.h"
#include "remat/train/schedule.h"

namespace remat::train {
namespace {

constexpr double kPi = 3.14159265358979323846;

// diffusers.optimization, written out: warmup ramp, then constant or half-cosine decay.
double expected_lr(LrScheduler kind, double lr, int64_t warmup, int64_t total, int64_t step) {
  if (kind == LrScheduler::Constant) return lr;
  if (step < warmup) return lr * double(step) / double(warmup);
  if (kind == LrScheduler::ConstantWithWarmup) return lr;
  const double p = double(step - warmup) / double(total - warmup);
  return lr * std::max(0.0, 0.5 * (1.0 + std::cos(kPi * p)));
}

TEST(LrSchedule, MatchesTheClosedForm) {
  const double lr = 3e-4;
  for (auto kind : {LrScheduler::Constant, LrScheduler::ConstantWithWarmup, LrScheduler::Cosine}) {
    for (int64_t warmup : {0, 1, 7}) {
      const int64_t total = 40;
      LrSchedule s{kind, lr, warmup, total};
      for (int64_t step = 0; step <= total + 5; ++step) {
        EXPECT_NEAR(lr_at_step(s, step), expected_lr(kind, lr, warmup, total, step), 1e-15) << int(kind) << " warmup " << warmup << " step " << step;
      }
    }
  }
}

TEST(LrSchedule, LandmarkValues) {
  const LrSchedule cosine{LrScheduler::Cosine, 1.0, 10, 110};
  EXPECT_DOUBLE_EQ(lr_at_step(cosine, 0), 0.0);   // warmup starts from 0
  EXPECT_DOUBLE_EQ(lr_at_step(cosine, 5), 0.5);   // half-way up
  EXPECT_DOUBLE_EQ(lr_at_step(cosine, 10), 1.0);  // peak
  EXPECT_NEAR(lr_at_step(cosine, 60), 0.5, 1e-12);  // half-way down
  EXPECT_NEAR(lr_at_step(cosine, 110), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(lr_at_step({LrScheduler::Constant, 2.0, 10, 100}, 0), 2.0);  // constant ignores warmup
  EXPECT_EQ(parse_lr_scheduler("cosine"), LrScheduler::Cosine);
  EXPECT_THROW(parse_lr_scheduler("linear"), ValidationError);
  EXPECT_THROW(lr_at_step(cosine, -1), ValidationError);
  EXPECT_THROW(lr_at_step({LrScheduler::Cosine, 1.0, 0, 0}, 0), ValidationError);
}

TEST(FlowShift, MatchesTheFormulaAndFixesTheEnds) {
  for (double shift : {0.5, 1.0, 3.0, 7.5}) {
    for (double s : {0.0, 0.1, 0.5, 0.9, 1.0}) {
      EXPECT_NEAR(shift_sigma(s, shift), shift * s / (1.0 + (shift - 1.0) * s), 1e-15);
    }
    EXPECT_DOUBLE_EQ(shift_sigma(0.0, shift), 0.0);
    EXPECT_DOUBLE_EQ(shift_sigma(1.0, shift), 1.0);
  }
  EXPECT_DOUBLE_EQ(shift_sigma(0.5, 3.0), 0.75);
  const auto s = torch::linspace(0, 1, 11, torch::kFloat64);
  const auto shifted = shift_sigmas(s, 3.0);
  for (int64_t i = 0; i < 11; ++i) {
    const double v = s[i].item<double>();
    EXPECT_NEAR(shifted[i].item<double>(), 3.0 * v / (1.0 + 2.0 * v), 1e-15);
  }
  EXPECT_THROW(shift_sigma(0.5, 0.0), ValidationError);
  EXPECT_THROW(shift_sigmas(torch::arange(3), 2.0), c10::Error);
}

TEST(SigmaSampling, LogitNormalIsSigmoidOfScaledNormalThenShift) {
  const double scale = 1.3, shift = 3.0;
  auto gen = at::detail::createCPUGenerator(42);
  const auto sigmas = sample_sigmas(8, SigmaSampling::LogitNormal, scale, shift, gen);
  ASSERT_EQ(sigmas.sizes(), (at::IntArrayRef{8}));
  EXPECT_EQ(sigmas.scalar_type(), at::kFloat);
  auto same = at::detail::createCPUGenerator(42);
  const auto normal = at::randn({8}, same, at::kFloat).to(at::kDouble);
  double max_diff = 0;
  for (int64_t i = 0; i < 8; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-scale * normal[i].item<double>()));
    const double want = shift * s / (1.0 + (shift - 1.0) * s);
    max_diff = std::max(max_diff, std::abs(sigmas[i].item<double>() - want));
  }
  EXPECT_LT(max_diff, 1e-6) << "max diff " << max_diff;
}

TEST(SigmaSampling, UniformIsRandThenShiftAndZeroShiftIsNone) {
  auto gen = at::detail::createCPUGenerator(7);
  const auto sigmas = sample_sigmas(16, SigmaSampling::Uniform, 1.0, 0.0, gen);
  auto same = at::detail::createCPUGenerator(7);
  const auto u = at::rand({16}, same, at::kFloat);
  EXPECT_TRUE(torch::equal(sigmas, u));  // shift 0: no shift, as in SimpleTuner
}

TEST(SigmaSampling, MedianMovesAsTheShiftPredicts) {
  // The shift is monotonic, so the sample median maps through it: logit-normal has median 0.5,
  // shifted by 3 it becomes 0.75. Statistical tolerance for 20000 samples.
  auto gen = at::detail::createCPUGenerator(3);
  const auto plain = sample_sigmas(20000, SigmaSampling::LogitNormal, 1.0, 0.0, gen);
  const auto shifted = sample_sigmas(20000, SigmaSampling::LogitNormal, 1.0, 3.0, gen);
  EXPECT_NEAR(plain.median().item<double>(), 0.5, 0.01);
  EXPECT_NEAR(shifted.median().item<double>(), 0.75, 0.01);
  EXPECT_GE(shifted.min().item<double>(), 0.0);
  EXPECT_LE(shifted.max().item<double>(), 1.0);
  EXPECT_THROW(sample_sigmas(0, SigmaSampling::Uniform, 1.0, 1.0, gen), ValidationError);
  EXPECT_THROW(sample_sigmas(4, SigmaSampling::LogitNormal, 0.0, 1.0, gen), ValidationError);
  EXPECT_THROW(sample_sigmas(4, SigmaSampling::LogitNormal, 1.0, -1.0, gen), ValidationError);
}

}  // namespace
}  // namespace remat::train
