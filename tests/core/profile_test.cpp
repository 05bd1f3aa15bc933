// profile_block and predict() against measurement: a chain of 8 residual MLP blocks
// (x + W2 gelu(W1 x + b1) + b2) of three widths, profiled per width, planned for several budgets
// and run for real with run_layout; the tracked peak of each step is compared with the
// prediction.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>

#include "remat/layout.h"
#include "remat/memory.h"
#include "remat/plan.h"
#include "remat/profile.h"

namespace {
namespace profile_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

constexpr int64_t kBatch = 256;
constexpr int64_t kDim = 64;
constexpr int64_t kFloat = 4;

struct Mlp {
  at::Tensor w1, b1, w2, b2;
  std::string kind;
};

Mlp make_mlp(int64_t hidden) {
  Mlp m;
  m.w1 = (torch::randn({hidden, kDim}) / std::sqrt(double(kDim))).requires_grad_(true);
  m.b1 = torch::zeros({hidden}).requires_grad_(true);
  m.w2 = (torch::randn({kDim, hidden}) / std::sqrt(double(hidden))).requires_grad_(true);
  m.b2 = torch::zeros({kDim}).requires_grad_(true);
  // Gradients allocated, as after a first training step (zero_grad keeps them).
  for (auto* p : {&m.w1, &m.b1, &m.w2, &m.b2}) p->mutable_grad() = torch::zeros_like(*p);
  m.kind = "mlp" + std::to_string(hidden);
  return m;
}

remat::Tensors run_mlp(const Mlp& m, const remat::Tensors& state) {
  const auto& x = state[0];
  auto h = torch::gelu(torch::nn::functional::linear(x, m.w1, m.b1));
  return {x + torch::nn::functional::linear(h, m.w2, m.b2)};
}

class MeasuredChain : public ::testing::Test {
 protected:
  void SetUp() override {
    // One intra-op thread: this test is about memory, which is the same with two (checked), and a
    // busy machine makes every parallel region wait for a descheduled thread.
    threads_ = torch::get_num_threads();
    torch::set_num_threads(1);
    torch::manual_seed(0);
    for (int64_t hidden : {128, 512, 256, 128, 512, 256, 128, 512}) blocks_.push_back(make_mlp(hidden));
    run_block_ = [this](int64_t k, const remat::Tensors& s) { return run_mlp(blocks_[k], s); };
  }

  remat::Tensors parameters_and_grads() const {
    remat::Tensors all;
    for (const auto& m : blocks_) {
      for (const auto* p : {&m.w1, &m.b1, &m.w2, &m.b2}) {
        all.push_back(*p);
        all.push_back(p->grad());
      }
    }
    return all;
  }

  void zero_grads() {
    for (auto& m : blocks_) {
      for (auto* p : {&m.w1, &m.b1, &m.w2, &m.b2}) p->mutable_grad().zero_();
    }
  }

  // One profile per block kind, on the first block of that kind.
  remat::Chain profiled_chain() {
    std::map<std::string, remat::BlockCost> by_kind;
    for (size_t k = 0; k < blocks_.size(); ++k) {
      if (by_kind.count(blocks_[k].kind) > 0) continue;
      const auto x = torch::randn({kBatch, kDim}).requires_grad_(true);
      by_kind[blocks_[k].kind] = remat::profile_block(run_block_, int64_t(k), {x}, blocks_[k].kind);
    }
    zero_grads();
    remat::Chain chain;
    for (const auto& m : blocks_) chain.blocks.push_back(by_kind.at(m.kind));
    chain.fixed_bytes = remat::storage_bytes(parameters_and_grads());
    chain.checkpoint_overhead_bytes = remat::checkpoint_overhead_bytes(c10::Device(c10::kCPU));
    return chain;
  }

  // A real training step of `layout`: forward, the caller's output gradient, backward. Returns
  // the tracked peak including what the step starts with (parameters, gradients, the input).
  int64_t measured_peak(const remat::Layout& layout, const at::Tensor& input) {
    zero_grads();
    input.mutable_grad().reset();
    remat::memory::PeakScope scope;
    {
      auto out = remat::run_layout(layout, {input}, run_block_)[0];
      auto grad = torch::randn_like(out);
      torch::autograd::backward({out}, {grad});
    }
    return scope.peak_delta() + remat::storage_bytes(parameters_and_grads()) +
           remat::storage_bytes({input});
  }

  void TearDown() override { torch::set_num_threads(threads_); }

  std::vector<Mlp> blocks_;
  remat::RunBlock run_block_;
  int threads_ = 1;
};

TEST_F(MeasuredChain, ProfileMatchesTheBlockStructure) {
  // Independent count for x + W2 gelu(W1 x + b1) + b2 on (B, D) float32: the graph keeps
  // W1 x + b1 (for gelu) and gelu(.) (for W2's gradient), each (B, H), and the input x (for W1's
  // gradient); the output is a new (B, D) tensor.
  const auto cost = profiled_chain().blocks[1];  // hidden 512
  const int64_t hidden = 512, state = kBatch * kDim * kFloat;
  EXPECT_EQ(cost.kind, "mlp512");
  EXPECT_EQ(cost.boundary_bytes, state);
  EXPECT_EQ(cost.boundary_grad_bytes, state);
  EXPECT_EQ(cost.output_bytes, state);
  EXPECT_EQ(cost.retained_input_bytes, state);
  EXPECT_EQ(cost.activation_bytes, 2 * kBatch * hidden * kFloat);
  EXPECT_GE(cost.forward_peak_bytes, cost.activation_bytes + state);
  // Backward makes at least the (B, H) gradient of the hidden activations and W's gradient
  // buffers (H, D) before they are accumulated.
  EXPECT_GE(cost.backward_peak_bytes, kBatch * hidden * kFloat);
  EXPECT_GT(cost.forward_s, 0.0);
  EXPECT_GT(cost.backward_s, 0.0);
}

TEST_F(MeasuredChain, PredictedPeaksMatchRealSteps) {
  const remat::Chain chain = profiled_chain();
  const int64_t n = chain.num_blocks();
  const auto input = torch::randn({kBatch, kDim}).requires_grad_(true);

  std::vector<std::pair<std::string, remat::Layout>> layouts;
  layouts.emplace_back("keep all", remat::layout_keep_all(n));
  for (int64_t interval = 1; interval <= n; ++interval) {
    layouts.emplace_back("interval " + std::to_string(interval), remat::layout_from_interval(n, interval));
  }
  layouts.emplace_back("interval 2 stride 3", remat::layout_from_interval(n, 2, 3));
  layouts.emplace_back("interval 3 stride 5", remat::layout_from_interval(n, 3, 5));

  // Budgets: evenly between the smallest possible peak and the keep-all peak, and the predicted
  // peak of every layout above (where the planner must do at least as well as that layout).
  const auto keep_peak = remat::predict(chain, remat::layout_keep_all(n)).peak_bytes;
  const auto smallest = remat::plan_layout(chain, 1).min_possible_peak;
  std::vector<int64_t> budgets;
  for (int i = 0; i <= 4; ++i) budgets.push_back(smallest + (keep_peak - smallest) * i / 4);
  for (const auto& [name, layout] : layouts) budgets.push_back(remat::predict(chain, layout).peak_bytes);
  std::sort(budgets.begin(), budgets.end());
  budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
  std::vector<remat::PlanResult> plans;
  for (int64_t budget : budgets) {
    plans.push_back(remat::plan_layout(chain, budget));
    ASSERT_TRUE(plans.back().fits) << budget;
    layouts.emplace_back("planned for " + std::to_string(budget) + " B", plans.back().layout);
  }
  for (size_t i = 0; i + 1 < layouts.size() && layouts[i].first.rfind("planned", 0) != 0; ++i) {
    const auto prediction = remat::predict(chain, layouts[i].second);
    const auto plan = remat::plan_layout(chain, prediction.peak_bytes);
    EXPECT_LE(plan.prediction.step_s, prediction.step_s + 1e-12) << layouts[i].first;
  }

  double worst = 0.0, worst_dynamic = 0.0;
  std::string worst_name;
  const int64_t start_bytes = chain.fixed_bytes + remat::storage_bytes({input});
  std::map<std::string, int64_t> measured;
  for (const auto& [name, layout] : layouts) {
    const auto predicted = remat::predict(chain, layout).peak_bytes;
    const int64_t actual = measured_peak(layout, input);
    measured[name] = actual;
    const double error = std::abs(double(predicted - actual)) / double(actual);
    const double dynamic_error =
        std::abs(double(predicted - actual)) / double(actual - start_bytes);
    std::cout << "[ measured ] " << name << " (" << remat::describe_layout(layout)
              << "): predicted " << predicted << " B, measured " << actual << " B, error "
              << 100.0 * error << "% (" << 100.0 * dynamic_error << "% of the step's own bytes)\n";
    EXPECT_LE(error, 0.05) << name << ": predicted " << predicted << ", measured " << actual;
    if (worst_name.empty() || error > worst) {
      worst = error;
      worst_name = name;
    }
    worst_dynamic = std::max(worst_dynamic, dynamic_error);
  }
  std::cout << "[ measured ] worst prediction error " << 100.0 * worst << "% (" << worst_name
            << "); worst relative to the step's own bytes " << 100.0 * worst_dynamic << "%\n";

  for (size_t i = 0; i < plans.size(); ++i) {
    const std::string name = "planned for " + std::to_string(budgets[i]) + " B";
    EXPECT_LE(measured.at(name), budgets[i]) << remat::describe_plan(plans[i]);
    EXPECT_GT(plans[i].prediction.step_s, 0.0);
    std::cout << "[ measured ] " << remat::describe_plan(plans[i]) << "\n";
  }
}

TEST(Profile, CountsWhatTheGraphKeeps) {
  // tanh(x W^T): the matmul keeps x (for W's gradient), tanh keeps its own result, which is the
  // block's output; x W^T itself is freed once tanh has run.
  const auto w = torch::randn({32, 32}).requires_grad_(true);
  w.mutable_grad() = torch::zeros_like(w);
  const remat::SegmentFn block = [w](const remat::Tensors& s) {
    return remat::Tensors{torch::tanh(torch::nn::functional::linear(s[0], w))};
  };
  const auto cost = remat::profile_block(block, {torch::randn({64, 32}).requires_grad_(true)}, "tanh");
  const int64_t state = 64 * 32 * kFloat;
  EXPECT_EQ(cost.retained_input_bytes, state);
  EXPECT_EQ(cost.activation_bytes, state);  // the kept output
  EXPECT_EQ(cost.output_bytes, state);
  EXPECT_GE(cost.forward_peak_bytes, 2 * state);  // x W^T and its tanh

  // A state tensor without grad (token ids, say) costs bytes but no gradient.
  const remat::SegmentFn pass = [w](const remat::Tensors& s) {
    return remat::Tensors{torch::nn::functional::linear(s[0], w), s[1]};
  };
  const auto ids = torch::arange(64, torch::kLong);
  const auto with_ids =
      remat::profile_block(pass, {torch::randn({64, 32}).requires_grad_(true), ids}, "ids");
  EXPECT_EQ(with_ids.boundary_bytes, state + 64 * 8);
  EXPECT_EQ(with_ids.boundary_grad_bytes, state);
  EXPECT_EQ(with_ids.output_grad_bytes, state);
}

TEST(Profile, RejectsBadInput) {
  const auto identity = [](const remat::Tensors& s) { return s; };
  try {
    remat::profile_block(remat::SegmentFn(identity), {at::Tensor()}, "x");
    FAIL() << "expected c10::ValueError";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("state must hold at least one defined tensor"), std::string::npos);
  }
  remat::ProfileOptions options;
  options.repeats = 0;
  try {
    remat::profile_block(remat::SegmentFn(identity), {torch::ones({2})}, "x", options);
    FAIL() << "expected c10::ValueError";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("repeats must be >= 1, got 0"), std::string::npos);
  }
}

}  // namespace profile_test
}  // namespace
