#include <cmath>
#include <utility>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/encoders/activations.h"
#include "remat/memory.h"

namespace {
namespace activations_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

// Element by element in double precision from the published formulas, independent of ATen's ops.
double quick_gelu_reference(double x) { return x / (1.0 + std::exp(-1.702 * x)); }
double gelu_tanh_reference(double x) {
  const double pi = std::acos(-1.0);
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}

template <typename F>
void expect_matches(const at::Tensor& out, const at::Tensor& in, F reference, double tolerance) {
  const auto x = in.to(at::kDouble).contiguous();
  const auto y = out.to(at::kDouble).contiguous();
  ASSERT_EQ(x.numel(), y.numel());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double xi = x.data_ptr<double>()[i];
    EXPECT_NEAR(y.data_ptr<double>()[i], reference(xi), tolerance * (1.0 + std::abs(reference(xi))))
        << "at x = " << xi;
  }
}

TEST(EncoderActivations, QuickGeluMatchesItsFormula) {
  const auto x = torch::linspace(-12.0, 12.0, 241, torch::kDouble);
  expect_matches(remat::encoders::quick_gelu(x), x, quick_gelu_reference, 1e-14);
  const auto xf = x.to(torch::kFloat);
  expect_matches(remat::encoders::quick_gelu(xf), xf, quick_gelu_reference, 1e-6);
}

TEST(EncoderActivations, GeluNewMatchesItsFormula) {
  const auto x = torch::linspace(-12.0, 12.0, 241, torch::kDouble);
  expect_matches(remat::encoders::gelu_new(x), x, gelu_tanh_reference, 1e-14);
  const auto xf = x.to(torch::kFloat);
  expect_matches(remat::encoders::gelu_new(xf), xf, gelu_tanh_reference, 1e-6);
}

TEST(EncoderActivations, KeepTheInputDtype) {
  const auto x = torch::randn({4, 8}).to(torch::kBFloat16);
  EXPECT_EQ(remat::encoders::quick_gelu(x).scalar_type(), torch::kBFloat16);
  EXPECT_EQ(remat::encoders::gelu_new(x).scalar_type(), torch::kBFloat16);
}

// The consuming forms (an intermediate handed over by value) give the same bits as the pure ones
// without autograd, in one buffer besides their input (tracked peak), and are the pure ones when
// autograd records: gradients flow.
TEST(EncoderActivations, ConsumingFormsEqualThePureOnesInOneBuffer) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto x = (torch::randn({64, 96}) * 4).to(dtype);
    const at::Tensor gelu = remat::encoders::gelu_new(x), quick = remat::encoders::quick_gelu(x);
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(remat::encoders::gelu_new_consuming(x.clone()), gelu)) << dtype;
    EXPECT_TRUE(torch::equal(remat::encoders::quick_gelu_consuming(x.clone()), quick)) << dtype;

    const int64_t buffer = x.numel() * x.element_size();
    at::Tensor own = x.clone();
    remat::memory::PeakScope scope;
    const at::Tensor out = remat::encoders::gelu_new_consuming(std::move(own));
    EXPECT_LE(scope.peak_delta(), buffer + 1024) << dtype;  // + LibTorch's scalar wrapping
    EXPECT_GE(scope.peak_delta(), buffer) << dtype;
  }
  const auto leaf = torch::randn({5}, torch::requires_grad());
  remat::encoders::gelu_new_consuming(leaf).sum().backward();
  const auto want = torch::autograd::grad({remat::encoders::gelu_new(leaf).sum()}, {leaf})[0];
  EXPECT_TRUE(torch::allclose(leaf.grad(), want));
  EXPECT_FALSE(torch::equal(leaf.grad(), torch::zeros_like(want)));
}

}  // namespace activations_test
}  // namespace
