// The budget planner against exhaustive search over every layout (every segmentation x every
// mode) under predict(), plus the nothing-fits answer, monotonicity and the log line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "remat/plan.h"

namespace {
namespace plan_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::BlockCost;
using remat::BlockMode;
using remat::Chain;
using remat::Layout;
using remat::Segment;

// A random chain with consistent boundaries: heterogeneous activations, states, retention,
// transients and times; sometimes a forced boundary, offload to host and an RNG overhead.
Chain random_chain(std::mt19937& rng, int64_t n) {
  std::uniform_int_distribution<int64_t> state(1, 120), act(0, 600), extra(0, 80), back(0, 400);
  std::uniform_real_distribution<double> seconds(0.1, 3.0);
  std::bernoulli_distribution coin(0.5);
  std::vector<int64_t> s(n + 1), g(n + 1);
  for (int64_t k = 0; k <= n; ++k) {
    s[k] = state(rng);
    g[k] = coin(rng) ? s[k] : s[k] / 2;
  }
  Chain chain;
  for (int64_t k = 0; k < n; ++k) {
    BlockCost b;
    b.kind = "random";
    b.forward_s = seconds(rng);
    b.backward_s = 2.0 * seconds(rng);
    b.activation_bytes = act(rng);
    b.retained_input_bytes = coin(rng) ? s[k] : 0;
    b.boundary_bytes = s[k];
    b.boundary_grad_bytes = g[k];
    b.output_bytes = s[k + 1];
    b.output_grad_bytes = g[k + 1];
    b.forward_peak_bytes = b.activation_bytes + s[k + 1] + extra(rng);
    b.backward_peak_bytes = back(rng);
    b.parameter_grad_bytes = coin(rng) ? extra(rng) : 0;
    chain.blocks.push_back(b);
  }
  // The rest of a training step (Note [Whole-step model]), in half of the chains.
  if (coin(rng)) {
    chain.tail_peak_bytes = back(rng);
    chain.tail_backward_bytes = std::uniform_int_distribution<int64_t>(-s[n], 100)(rng);
    chain.fixed_peak_bytes = std::uniform_int_distribution<int64_t>(0, 2500)(rng);
    chain.fixed_time_s = seconds(rng);
  }
  chain.fixed_bytes = std::uniform_int_distribution<int64_t>(0, 1000)(rng);
  chain.offload_to_host = coin(rng);
  chain.host_bandwidth_bytes_per_s = std::uniform_real_distribution<double>(20.0, 400.0)(rng);
  chain.checkpoint_overhead_bytes = coin(rng) ? 0 : std::uniform_int_distribution<int64_t>(1, 20)(rng);
  if (n >= 3 && coin(rng)) {
    chain.forced_boundaries = {std::uniform_int_distribution<int64_t>(1, n - 1)(rng)};
  }
  return chain;
}

struct Outcome {
  int64_t peak;
  double time;
  bool uses_offload;
  // For PlannerOptions::stream_from: bit k set when block k starts a segment, and the smallest k
  // from which every segment is one block, not Keep.
  uint32_t starts;
  int64_t streamable_from;
};

// Whether a layout obeys stream_from = k: blocks from k on are one-block checkpoints (so a
// segment starts at k, unless k is past the chain).
bool obeys_stream_from(const Outcome& o, int64_t k, int64_t n) {
  if (k >= n) return true;
  return k >= o.streamable_from && ((o.starts >> k) & 1u) != 0;
}

// predict() on every layout: every composition of the blocks into segments that respect the
// forced boundaries, every segment in every mode.
std::vector<Outcome> all_outcomes(const Chain& chain) {
  const int64_t n = chain.num_blocks();
  std::vector<Outcome> outcomes;
  Layout layout;
  std::function<void(int64_t)> extend = [&](int64_t p) {
    if (p == n) {
      const auto prediction = remat::predict(chain, layout);
      bool offload = false;
      uint32_t starts = 0;
      int64_t streamable_from = n;
      for (const auto& s : layout.segments) {
        offload |= s.mode == BlockMode::Offload;
        starts |= 1u << s.begin;
      }
      for (auto s = layout.segments.rbegin(); s != layout.segments.rend(); ++s) {
        if (s->end - s->begin != 1 || s->mode == BlockMode::Keep) break;
        streamable_from = s->begin;
      }
      outcomes.push_back({prediction.peak_bytes, prediction.step_s, offload, starts, streamable_from});
      return;
    }
    for (int64_t q = p + 1; q <= n; ++q) {
      for (BlockMode mode : {BlockMode::Keep, BlockMode::Recompute, BlockMode::Offload}) {
        layout.segments.push_back({p, q, mode});
        const bool crosses = std::any_of(chain.forced_boundaries.begin(), chain.forced_boundaries.end(),
                                         [&](int64_t b) { return p < b && b < q; });
        if (!crosses) extend(q);
        layout.segments.pop_back();
      }
    }
  };
  extend(0);
  return outcomes;
}

void expect_optimal(const Chain& chain, const std::vector<Outcome>& outcomes, int64_t budget,
                    bool allow_offload, const std::string& where,
                    int64_t stream_from = std::numeric_limits<int64_t>::max()) {
  double best = INFINITY;
  int64_t min_peak = INT64_MAX;
  for (const auto& o : outcomes) {
    if (o.uses_offload && !allow_offload) continue;
    if (!obeys_stream_from(o, stream_from, chain.num_blocks())) continue;
    min_peak = std::min(min_peak, o.peak);
    if (o.peak <= budget) best = std::min(best, o.time);
  }
  remat::PlannerOptions options;
  options.allow_offload = allow_offload;
  options.stream_from = stream_from;
  const auto result = remat::plan_layout(chain, budget, options);
  const bool fits = std::isfinite(best);
  ASSERT_EQ(result.fits, fits) << where;
  EXPECT_EQ(result.min_possible_peak, min_peak) << where;
  // The result is what predict() says of the returned layout.
  const auto again = remat::predict(chain, result.layout);
  EXPECT_EQ(again.peak_bytes, result.prediction.peak_bytes) << where;
  if (fits) {
    EXPECT_LE(result.prediction.peak_bytes, budget) << where;
    EXPECT_NEAR(result.prediction.step_s, best, 1e-9 * best) << where << " layout "
                                                              << remat::describe_layout(result.layout);
  } else {
    EXPECT_EQ(result.prediction.peak_bytes, min_peak) << where;
  }
  if (!allow_offload) {
    for (const auto& s : result.layout.segments) EXPECT_NE(s.mode, BlockMode::Offload) << where;
  }
  for (const auto& s : result.layout.segments) {
    if (s.end <= stream_from) continue;
    EXPECT_EQ(s.end - s.begin, 1) << where << ": streamed blocks are checkpointed one per segment";
    EXPECT_NE(s.mode, BlockMode::Keep) << where << ": a streamed block is kept";
  }
}

TEST(Planner, OptimalAgainstExhaustiveSearch) {
  int checked = 0;
  for (int seed = 0; seed < 40; ++seed) {
    std::mt19937 rng(1234 + seed);
    const int64_t n = seed < 36 ? 1 + seed % 8 : 9 + seed % 2;  // 1..8, then 9 and 10 blocks
    const Chain chain = random_chain(rng, n);
    const auto outcomes = all_outcomes(chain);
    // Budgets at every distinct achieved peak (the tightest cases), one byte below some, and
    // random ones between the smallest and largest.
    std::vector<int64_t> peaks;
    for (const auto& o : outcomes) peaks.push_back(o.peak);
    std::sort(peaks.begin(), peaks.end());
    peaks.erase(std::unique(peaks.begin(), peaks.end()), peaks.end());
    std::vector<int64_t> budgets;
    const size_t stride = std::max<size_t>(1, peaks.size() / 6);
    for (size_t i = 0; i < peaks.size(); i += stride) {
      budgets.push_back(peaks[i]);
      budgets.push_back(peaks[i] - 1);
    }
    std::uniform_int_distribution<int64_t> between(peaks.front(), peaks.back());
    for (int i = 0; i < 3; ++i) budgets.push_back(between(rng));
    for (int64_t budget : budgets) {
      if (budget <= 0) continue;
      for (bool allow_offload : {true, false}) {
        const std::string where = "seed " + std::to_string(seed) + ", " + std::to_string(n) +
                                  " blocks, budget " + std::to_string(budget) +
                                  (allow_offload ? ", offload allowed" : "");
        expect_optimal(chain, outcomes, budget, allow_offload, where);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

// Streamed blocks (block swap) may not be kept and are checkpointed one per segment: the planner
// is still the fastest of the layouts that obey that.
TEST(Planner, StreamedBlocksOptimalAgainstExhaustiveSearch) {
  int checked = 0;
  for (int seed = 0; seed < 24; ++seed) {
    std::mt19937 rng(777 + seed);
    const int64_t n = 1 + seed % 8;
    const Chain chain = random_chain(rng, n);
    const auto outcomes = all_outcomes(chain);
    std::vector<int64_t> peaks;
    for (const auto& o : outcomes) peaks.push_back(o.peak);
    std::sort(peaks.begin(), peaks.end());
    std::uniform_int_distribution<int64_t> between(peaks.front(), peaks.back());
    for (int64_t stream_from = 0; stream_from <= n; ++stream_from) {
      for (int i = 0; i < 3; ++i) {
        const int64_t budget = std::max<int64_t>(1, between(rng));
        for (bool allow_offload : {true, false}) {
          expect_optimal(chain, outcomes, budget, allow_offload,
                         "seed " + std::to_string(seed) + ", " + std::to_string(n) + " blocks, streamed from " +
                             std::to_string(stream_from) + ", budget " + std::to_string(budget),
                         stream_from);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 500);
}

// A Flux-dev-shaped chain: 19 double blocks then 38 single blocks, forced boundary at 19.
Chain flux_like_chain() {
  BlockCost dbl, sgl;
  const int64_t state = 48LL << 20, grad = state;
  dbl.kind = "double";
  dbl.forward_s = 0.020;
  dbl.backward_s = 0.040;
  dbl.activation_bytes = 900LL << 20;
  sgl.kind = "single";
  sgl.forward_s = 0.012;
  sgl.backward_s = 0.024;
  sgl.activation_bytes = 500LL << 20;
  for (BlockCost* b : {&dbl, &sgl}) {
    b->retained_input_bytes = state;
    b->boundary_bytes = b->output_bytes = state;
    b->boundary_grad_bytes = b->output_grad_bytes = grad;
    b->forward_peak_bytes = b->activation_bytes + state + (64LL << 20);
    b->backward_peak_bytes = b->activation_bytes / 2;
  }
  Chain chain;
  for (int i = 0; i < 19; ++i) chain.blocks.push_back(dbl);
  for (int i = 0; i < 38; ++i) chain.blocks.push_back(sgl);
  chain.fixed_bytes = 12LL << 30;
  chain.forced_boundaries = {19};
  chain.offload_to_host = true;
  return chain;
}

TEST(Planner, BiggerBudgetNeverSlower) {
  const Chain chain = flux_like_chain();
  const auto keep = remat::predict(chain, remat::layout_keep_all(57));
  const auto tightest = remat::plan_layout(chain, 1);
  ASSERT_FALSE(tightest.fits);
  double previous = INFINITY;
  for (int step = 0; step <= 12; ++step) {
    const int64_t budget = tightest.min_possible_peak +
                           (keep.peak_bytes - tightest.min_possible_peak) * step / 12;
    const auto result = remat::plan_layout(chain, budget);
    ASSERT_TRUE(result.fits) << budget;
    EXPECT_LE(result.prediction.peak_bytes, budget);
    EXPECT_LE(result.prediction.step_s, previous + 1e-12) << remat::describe_plan(result);
    previous = result.prediction.step_s;
  }
  // At the keep-all peak nothing needs checkpointing.
  const auto roomy = remat::plan_layout(chain, keep.peak_bytes);
  EXPECT_EQ(roomy.layout.num_checkpoints(), 0);
  EXPECT_DOUBLE_EQ(roomy.prediction.step_s, keep.step_s);
}

TEST(Planner, AtLeastAsFastAsEveryIntervalLayoutThatFits) {
  const Chain chain = flux_like_chain();
  for (int64_t interval = 1; interval <= 8; ++interval) {
    for (auto backend : {remat::Backend::Recompute, remat::Backend::Offload}) {
      const Layout layout = remat::split_layout(
          remat::layout_from_interval(57, interval, std::nullopt, backend), chain.forced_boundaries);
      const auto prediction = remat::predict(chain, layout);
      const auto plan = remat::plan_layout(chain, prediction.peak_bytes);
      ASSERT_TRUE(plan.fits) << "interval " << interval;
      EXPECT_LE(plan.prediction.step_s, prediction.step_s + 1e-12) << "interval " << interval;
      EXPECT_LE(plan.min_possible_peak, prediction.peak_bytes);
    }
  }
}

TEST(Planner, NothingFitsSaysWhatToChange) {
  const Chain chain = flux_like_chain();
  const auto result = remat::plan_layout(chain, (25LL << 29));
  EXPECT_FALSE(result.fits);
  EXPECT_GT(result.min_possible_peak, (25LL << 29));
  EXPECT_EQ(result.prediction.peak_bytes, result.min_possible_peak);
  EXPECT_NE(result.explanation.find("nothing fits in 12.50 GiB"), std::string::npos)
      << result.explanation;
  EXPECT_NE(result.explanation.find("resolution or the batch size"), std::string::npos);
  EXPECT_NE(result.explanation.find("at least"), std::string::npos);

  // Without offload allowed, the planner says offloading would lower the smallest peak.
  remat::PlannerOptions no_offload;
  no_offload.allow_offload = false;
  const auto without = remat::plan_layout(chain, (25LL << 29), no_offload);
  EXPECT_GE(without.min_possible_peak, result.min_possible_peak);
  if (without.min_possible_peak > result.min_possible_peak) {
    EXPECT_NE(without.explanation.find("enable offloading"), std::string::npos) << without.explanation;
  }

  // Parameters alone over budget: the advice is about them.
  const auto tiny = remat::plan_layout(chain, 8LL << 30);
  EXPECT_NE(tiny.explanation.find("Parameters, gradients and optimizer state alone take 12.00 GiB"),
            std::string::npos)
      << tiny.explanation;
}

TEST(Planner, DescribePlanIsOneReadableLine) {
  const Chain chain = flux_like_chain();
  const auto keep = remat::predict(chain, remat::layout_keep_all(57));
  const auto result = remat::plan_layout(chain, (keep.peak_bytes + (12LL << 30)) / 2);
  ASSERT_TRUE(result.fits);
  const std::string line = remat::describe_plan(result);
  EXPECT_EQ(line.rfind("auto: ", 0), 0u) << line;
  EXPECT_NE(line.find(" | "), std::string::npos) << line;  // the forced boundary at 19
  EXPECT_NE(line.find("predicted peak"), std::string::npos) << line;
  EXPECT_NE(line.find("GiB budget, step"), std::string::npos) << line;
  EXPECT_NE(line.find("over no checkpointing)"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
  // The segments before the '|' end at block 18.
  EXPECT_NE(line.find("18] | "), std::string::npos) << line;
}

TEST(Planner, RejectsBadBudget) {
  try {
    remat::plan_layout(flux_like_chain(), 0);
    FAIL() << "expected c10::ValueError";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("budget_bytes must be > 0, got 0"), std::string::npos);
  }
}

}  // namespace plan_test
}  // namespace
