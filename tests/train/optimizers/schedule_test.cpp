// Learning-rate schedules and flow-matching sigmas against their closed-form formulas, computed
// here in double precision.
#include <gtest/gtest.h>

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "remat/train/options/config.h"
#include "remat/train/family/flow_matching.h"
#include "remat/train/optimizers/lr_schedule.h"

namespace remat::train {
namespace {
namespace schedule_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

constexpr double kPi = 3.14159265358979323846;

// Each schedule's closed form, written out here from its source in double precision (remat's
// implementation is not used): diffusers.optimization for constant, constant_with_warmup and
// linear; SimpleTuner's helpers/training/custom_schedule.py for polynomial, cosine, sine and
// cosine_with_restarts, read as what each does when stepped once per optimizer step.
double floor_nano(double lr) { return std::floor(lr * 1e9) / 1e9; }

double constant(double lr, int64_t) { return lr; }
double constant_with_warmup(double lr, int64_t w, int64_t k) { return k < w ? lr * double(k) / double(w) : lr; }
double linear(double lr, int64_t w, int64_t T, int64_t k) {
  if (k < w) return lr * double(k) / double(w);
  return lr * std::max(0.0, double(T - k) / double(T - w));
}
double polynomial(double lr, double end, double power, int64_t w, int64_t T, int64_t k) {
  if (k < w) return lr * double(k) / double(w);
  if (k > T) return end;
  return (lr - end) * std::pow(1.0 - double(k - w) / double(T - w), power) + end;
}
// Cosine(T_0 = w, steps_per_epoch = -1): T_cur = k // -1 + (k % -1) / -1 = -k.
double cosine(double lr, double end, int64_t w, int64_t k) {
  const double t_cur = -double(k), t_i = w > 0 ? double(w) : 1000.0;
  return floor_nano(end + (lr - end) * (1.0 + std::cos(kPi * t_cur / t_i)) / 2.0);
}
// Sine(T_0 = w): total_steps = k.
double sine(double lr, double end, int64_t w, int64_t k) {
  return floor_nano(end + (lr - end) * (0.5 * (1.0 + std::sin(kPi * double(k) / double(w)))));
}
// CosineAnnealingHardRestarts(T_0 = w, steps_per_epoch = -1): T_cur = k % -1 = 0.
double cosine_with_restarts(double lr, double end, int64_t w, int64_t) {
  const double t_cur = 0.0;
  return floor_nano(end + (lr - end) * (1.0 + std::cos(kPi * t_cur / double(w))) / 2.0);
}

TEST(LrSchedule, EveryScheduleMatchesItsClosedForm) {
  const double lr = 3e-4, end = 2e-5, power = 0.8;
  const int64_t T = 40;
  for (const int64_t w : {0, 1, 7, 13}) {
    for (int64_t k = 0; k <= T + 5; ++k) {
      const auto at = [&](const std::string& name) {
        return lr_at_step({parse_lr_scheduler(name), lr, w, T, end, power}, k);
      };
      const std::string where = "warmup " + std::to_string(w) + " step " + std::to_string(k);
      EXPECT_DOUBLE_EQ(at("constant"), constant(lr, k)) << where;
      EXPECT_NEAR(at("constant_with_warmup"), w > 0 ? constant_with_warmup(lr, w, k) : lr, 1e-15) << where;
      EXPECT_NEAR(at("linear"), w > 0 ? linear(lr, w, T, k) : lr * std::max(0.0, double(T - k) / double(T)), 1e-15)
          << where;
      EXPECT_NEAR(at("polynomial"), w > 0 ? polynomial(lr, end, power, w, T, k) : polynomial(lr, end, power, 0, T, k),
                  1e-15) << where;
      EXPECT_NEAR(at("cosine"), cosine(lr, end, w, k), 1e-15) << where;
      EXPECT_NEAR(at("cosine_with_warmup"), cosine(lr, end, w, k), 1e-15) << where;  // the alias
      if (w > 0) {
        EXPECT_NEAR(at("sine"), sine(lr, end, w, k), 1e-15) << where;
        EXPECT_NEAR(at("cosine_with_restarts"), cosine_with_restarts(lr, end, w, k), 1e-15) << where;
      }
    }
  }
}

TEST(LrSchedule, LandmarkValues) {
  // diffusers' warmup: the first update uses lr 0.
  const LrSchedule linear_s{LrScheduler::Linear, 1.0, 10, 110};
  EXPECT_DOUBLE_EQ(lr_at_step(linear_s, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_at_step(linear_s, 5), 0.5);
  EXPECT_DOUBLE_EQ(lr_at_step(linear_s, 10), 1.0);
  EXPECT_DOUBLE_EQ(lr_at_step(linear_s, 60), 0.5);
  EXPECT_DOUBLE_EQ(lr_at_step(linear_s, 110), 0.0);
  // SimpleTuner's cosine: no warmup; down to lr_end at step w, back at 2w.
  const LrSchedule cos_s{LrScheduler::Cosine, 1.0, 10, 110, 0.0};
  EXPECT_DOUBLE_EQ(lr_at_step(cos_s, 0), 1.0);
  EXPECT_NEAR(lr_at_step(cos_s, 5), 0.5, 1e-9);
  EXPECT_NEAR(lr_at_step(cos_s, 10), 0.0, 1e-9);
  EXPECT_NEAR(lr_at_step(cos_s, 20), 1.0, 1e-9);
  // Sine starts half-way, peaks at w / 2.
  const LrSchedule sine_s{LrScheduler::Sine, 1.0, 10, 110, 0.0};
  EXPECT_NEAR(lr_at_step(sine_s, 0), 0.5, 1e-9);
  EXPECT_NEAR(lr_at_step(sine_s, 5), 1.0, 1e-9);
  EXPECT_NEAR(lr_at_step(sine_s, 15), 0.0, 1e-9);
  // Polynomial ends at lr_end and stays there.
  const LrSchedule poly{LrScheduler::Polynomial, 1.0, 0, 100, 0.25, 2.0};
  EXPECT_DOUBLE_EQ(lr_at_step(poly, 0), 1.0);
  EXPECT_DOUBLE_EQ(lr_at_step(poly, 50), 0.75 * 0.25 + 0.25);
  EXPECT_DOUBLE_EQ(lr_at_step(poly, 100), 0.25);
  EXPECT_DOUBLE_EQ(lr_at_step(poly, 150), 0.25);
  // The floor to 1e-9 of SimpleTuner's own schedulers.
  EXPECT_DOUBLE_EQ(lr_at_step({LrScheduler::CosineWithRestarts, 1.23456789123e-4, 5, 10}, 3), 1.23456e-4);
  EXPECT_DOUBLE_EQ(lr_at_step({LrScheduler::Constant, 2.0, 10, 100}, 0), 2.0);  // constant ignores warmup
  EXPECT_EQ(parse_lr_scheduler("cosine"), LrScheduler::Cosine);
  EXPECT_EQ(parse_lr_scheduler("cosine_with_warmup"), LrScheduler::Cosine);
  EXPECT_EQ(lr_scheduler_names().size(), 7u);
  EXPECT_THROW(parse_lr_scheduler("cosine_annealing"), ValidationError);
  EXPECT_THROW(lr_at_step(linear_s, -1), ValidationError);
  EXPECT_THROW(lr_at_step({LrScheduler::Linear, 1.0, 0, 0}, 0), ValidationError);
  EXPECT_THROW(lr_at_step({LrScheduler::Sine, 1.0, 0, 10}, 0), ValidationError);
  EXPECT_THROW(lr_at_step({LrScheduler::CosineWithRestarts, 1.0, 0, 10}, 0), ValidationError);
  EXPECT_THROW(lr_at_step({LrScheduler::Polynomial, 1e-7, 0, 10, 4e-7}, 0), ValidationError);
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

}  // namespace schedule_test
}  // namespace
}  // namespace remat::train
