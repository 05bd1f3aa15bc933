#pragma once
// Helpers shared by the core tests: gradient snapshots and exact comparisons with readable
// failure messages.

#include <map>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace remat::testing {

/// Gradients of every parameter of `module`, cloned, by name (undefined grads are skipped).
inline std::map<std::string, torch::Tensor> grads_of(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> grads;
  for (const auto& item : module.named_parameters()) {
    if (item.value().grad().defined()) grads[item.key()] = item.value().grad().clone();
  }
  return grads;
}

/// Max |a - b| as a printable double (for failure messages).
inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

/// Asserts two gradient maps have the same keys and bitwise-equal tensors.
inline void expect_bitwise_equal(const std::map<std::string, torch::Tensor>& expected,
                                 const std::map<std::string, torch::Tensor>& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [name, tensor] : expected) {
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << "missing gradient for " << name;
    EXPECT_TRUE(torch::equal(tensor, it->second))
        << name << ": max diff " << max_abs_diff(tensor, it->second);
  }
}

}  // namespace remat::testing
