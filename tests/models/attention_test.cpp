// The attention every block runs (remat::compat::scaled_dot_product_attention): at::scaled_dot_
// product_attention on LibTorch 2.x, the written-out formula on 1.13. Both are checked against a
// float64 evaluation of softmax(q k^T / sqrt(d)) v, and the fused kernel against the formula within
// stated tolerances; the tracking allocator shows what the fused kernel does not hold at 4096
// tokens (the score matrix and its softmax, in inference and saved for backward).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "remat/compat.h"
#include "remat/memory.h"

namespace remat {
namespace {
namespace attention_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// The published formula in float64, element by element of the softmax: exp(s - max) / sum.
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  const at::Tensor qd = q.to(at::kDouble), kd = k.to(at::kDouble), vd = v.to(at::kDouble);
  at::Tensor scores = at::matmul(qd, kd.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (mask.defined()) scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  const at::Tensor e = (scores - std::get<0>(scores.max(-1, true))).exp();
  return at::matmul(e / e.sum(-1, true), vd);
}

struct Case {
  at::ScalarType dtype;
  double tolerance;  // against the float64 reference, and between the two paths
};

TEST(Attention, FusedKernelAndFormulaEqualTheFloat64Reference) {
  torch::manual_seed(0);
  // fp32: both accumulate in fp32 over d = 64 and 300 keys. bf16: the formula rounds the scores to
  // bf16 (half an ulp is 2^-7 for |s| in [2, 4), 2^-6 in [4, 8): softmax weights off by up to ~1.6%)
  // and the output again (8 mantissa bits).
  for (const Case c : {Case{at::kFloat, 1e-5}, Case{at::kBFloat16, 4e-2}, Case{at::kDouble, 1e-12}}) {
    SCOPED_TRACE(c10::toString(c.dtype));
    const at::Tensor q = torch::randn({2, 3, 200, 64}).to(c.dtype);
    const at::Tensor k = torch::randn({2, 3, 300, 64}).to(c.dtype);
    const at::Tensor v = torch::randn({2, 3, 300, 64}).to(c.dtype);
    const at::Tensor mask = torch::rand({2, 1, 200, 300}) > 0.2;
    for (const bool masked : {false, true}) {
      SCOPED_TRACE(masked ? "with a mask" : "no mask");
      const c10::optional<at::Tensor> m = masked ? c10::optional<at::Tensor>(mask) : c10::nullopt;
      const at::Tensor want = reference(q, k, v, masked ? mask : at::Tensor());
      const at::Tensor fused = compat::scaled_dot_product_attention(q, k, v, m);
      const at::Tensor formula = compat::attention_formula(q, k, v, m);
      EXPECT_EQ(fused.scalar_type(), c.dtype);
      EXPECT_LE(max_abs_diff(fused, want), c.tolerance);
      EXPECT_LE(max_abs_diff(formula, want), c.tolerance);
      EXPECT_LE(max_abs_diff(fused, formula), 2 * c.tolerance);
      std::printf("[ %s, %s ] max |fused - float64| %.3g, |formula - float64| %.3g, |fused - formula| %.3g\n",
                  c10::toString(c.dtype), masked ? "mask" : "no mask", max_abs_diff(fused, want),
                  max_abs_diff(formula, want), max_abs_diff(fused, formula));
    }
  }
}

TEST(Attention, FusedGradientsEqualTheFormulas) {
  auto grads = [](bool fused) {
    torch::manual_seed(2);
    const at::Tensor q = torch::randn({1, 2, 128, 32}).requires_grad_();
    const at::Tensor k = torch::randn({1, 2, 128, 32}).requires_grad_();
    const at::Tensor v = torch::randn({1, 2, 128, 32}).requires_grad_();
    const at::Tensor w = torch::randn({1, 2, 128, 32});
    const at::Tensor out = fused ? compat::scaled_dot_product_attention(q, k, v) : compat::attention_formula(q, k, v);
    (out * w).sum().backward();
    return std::vector<at::Tensor>{q.grad(), k.grad(), v.grad()};
  };
  const auto a = grads(true), b = grads(false);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(max_abs_diff(a[i], b[i]), 1e-5) << "input " << i;
}

// 4096 tokens, 2 heads of 64: one fp32 score matrix is 2 * 4096^2 * 4 bytes = 128 MiB.
TEST(Attention, AtFourThousandTokensTheFusedKernelHoldsNoScoreMatrix) {
  ASSERT_TRUE(memory::cpu_tracking_installed());
  constexpr int64_t kHeads = 2, kTokens = 4096, kDim = 64;
  constexpr int64_t kScores = kHeads * kTokens * kTokens * 4;
  torch::manual_seed(3);
  const at::Tensor q = torch::randn({1, kHeads, kTokens, kDim});
  const at::Tensor k = torch::randn({1, kHeads, kTokens, kDim});
  const at::Tensor v = torch::randn({1, kHeads, kTokens, kDim});

  struct Figures {
    int64_t inference_peak, training_held;
  };
  auto measure = [&](bool fused) {
    auto run = [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
      return fused ? compat::scaled_dot_product_attention(a, b, c) : compat::attention_formula(a, b, c);
    };
    Figures f{};
    {
      torch::NoGradGuard no_grad;
      memory::PeakScope scope;
      const at::Tensor out = run(q, k, v);
      f.inference_peak = scope.peak_delta();
    }
    // Training: what autograd keeps from the forward pass for backward (plus the output).
    const at::Tensor qg = q.clone().requires_grad_(), kg = k.clone().requires_grad_(), vg = v.clone().requires_grad_();
    const int64_t before = memory::current_bytes();
    {
      const at::Tensor out = run(qg, kg, vg);
      f.training_held = memory::current_bytes() - before;
    }
    return f;
  };
  const Figures formula = measure(false);
  const Figures fused = measure(true);
  std::printf("[ attention, 4096 tokens, 2 heads x 64, fp32 ] inference peak: formula %.1f MiB, %s %.1f MiB; "
              "held for backward: formula %.1f MiB, %s %.1f MiB\n",
              formula.inference_peak / 1048576.0, compat::kHasScaledDotProductAttention ? "fused" : "formula (1.13)",
              fused.inference_peak / 1048576.0, formula.training_held / 1048576.0,
              compat::kHasScaledDotProductAttention ? "fused" : "formula (1.13)", fused.training_held / 1048576.0);
  // The formula holds the scores and their softmax at once, and saves the softmax for backward.
  EXPECT_GE(formula.inference_peak, 2 * kScores);
  EXPECT_GE(formula.training_held, kScores);
  if (compat::kHasScaledDotProductAttention) {
    // The fused kernel: the output and per-row statistics, never an L x L matrix.
    EXPECT_LT(fused.inference_peak, kScores / 8);
    EXPECT_LT(fused.training_held, kScores / 8);
  } else {
    EXPECT_EQ(fused.inference_peak, formula.inference_peak);  // 1.13 runs the formula itself
  }
}

}  // namespace attention_test
}  // namespace
}  // namespace remat
