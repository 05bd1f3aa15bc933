#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/encoders/activations.h"

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

}  // namespace activations_test
}  // namespace
