#pragma once
// Helpers shared by the models tests: tolerance checks that print the max difference, and a
// forward/backward runner collecting every gradient.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "remat/memory.h"

namespace remat::models::test {

/// EXPECT that a and b are allclose(rtol, atol); on failure prints the max abs diff.
inline ::testing::AssertionResult close(const at::Tensor& a, const at::Tensor& b, double rtol,
                                        double atol) {
  if (!a.defined() || !b.defined()) {
    if (a.defined() == b.defined()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "one tensor is undefined";
  }
  if (a.sizes() != b.sizes()) {
    return ::testing::AssertionFailure() << "shapes differ: " << a.sizes() << " vs " << b.sizes();
  }
  const auto ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  const double max_diff = ad.numel() == 0 ? 0.0 : (ad - bd).abs().max().item<double>();
  if (torch::allclose(ad, bd, rtol, atol)) return ::testing::AssertionSuccess() << "max diff " << max_diff;
  return ::testing::AssertionFailure() << "max abs diff " << max_diff << " (rtol " << rtol
                                       << ", atol " << atol << ")";
}

/// Output, parameter gradients (by name; undefined when none) and input gradients of one
/// forward + backward, plus the bytes the autograd graph kept alive after the forward pass.
struct RunResult {
  at::Tensor output;
  std::map<std::string, at::Tensor> param_grads;
  std::vector<at::Tensor> input_grads;
  int64_t retained_bytes = 0;
};

/// Clears all grads, runs `forward(inputs)` with inputs made to require grad, backpropagates
/// sum(output * weight) and collects the gradients.
inline RunResult run_with_grads(torch::nn::Module& model, const std::vector<at::Tensor>& inputs_in,
                                const std::function<at::Tensor(const std::vector<at::Tensor>&)>& forward,
                                const at::Tensor& loss_weight) {
  for (auto& p : model.parameters()) p.mutable_grad().reset();
  std::vector<at::Tensor> inputs;
  for (const auto& t : inputs_in) inputs.push_back(t.detach().clone().requires_grad_(true));
  const int64_t before = remat::memory::current_bytes();
  RunResult r;
  at::Tensor out = forward(inputs);
  r.retained_bytes = remat::memory::current_bytes() - before;
  (out * loss_weight).sum().backward();
  r.output = out.detach();
  for (const auto& item : model.named_parameters()) {
    r.param_grads[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : at::Tensor();
  }
  for (const auto& t : inputs) r.input_grads.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
  return r;
}

/// Checks output and every gradient of `got` against `want`; returns the number of gradients
/// compared (so callers can assert the comparison was not vacuous).
inline int expect_same_run(const RunResult& got, const RunResult& want, double rtol, double atol,
                           const std::string& label) {
  EXPECT_TRUE(close(got.output, want.output, rtol, atol)) << label << ": output";
  int compared = 0;
  for (const auto& [name, grad] : want.param_grads) {
    auto it = got.param_grads.find(name);
    if (it == got.param_grads.end()) {
      ADD_FAILURE() << label << ": missing parameter " << name;
      continue;
    }
    EXPECT_EQ(it->second.defined(), grad.defined()) << label << ": grad presence of " << name;
    if (grad.defined() && it->second.defined()) {
      EXPECT_TRUE(close(it->second, grad, rtol, atol)) << label << ": grad of " << name;
      ++compared;
    }
  }
  EXPECT_EQ(got.input_grads.size(), want.input_grads.size());
  for (size_t i = 0; i < want.input_grads.size() && i < got.input_grads.size(); ++i) {
    EXPECT_TRUE(close(got.input_grads[i], want.input_grads[i], rtol, atol))
        << label << ": grad of input " << i;
    ++compared;
  }
  return compared;
}

}  // namespace remat::models::test
