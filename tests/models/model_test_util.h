#pragma once
// Helpers shared by the models tests: tolerance checks that print the max difference, a
// forward/backward runner collecting every gradient, and small Flux and MageFlow training steps.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "remat/memory.h"
#include "remat/models/flux.h"
#include "remat/models/lora.h"
#include "remat/models/mageflow.h"

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

/// EXPECT that two runs are bitwise equal: output, every parameter gradient (presence too) and
/// every input gradient; at least one gradient is compared.
inline void expect_bitwise_run(const RunResult& got, const RunResult& want, const std::string& label) {
  EXPECT_TRUE(torch::equal(got.output, want.output)) << label << ": output";
  int compared = 0;
  for (const auto& [name, grad] : want.param_grads) {
    const auto it = got.param_grads.find(name);
    if (it == got.param_grads.end()) {
      ADD_FAILURE() << label << ": missing parameter " << name;
      continue;
    }
    ASSERT_EQ(it->second.defined(), grad.defined()) << label << ": " << name;
    if (!grad.defined()) continue;
    EXPECT_TRUE(torch::equal(it->second, grad)) << label << ": gradient of " << name;
    ++compared;
  }
  ASSERT_EQ(got.input_grads.size(), want.input_grads.size()) << label;
  for (size_t i = 0; i < want.input_grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(got.input_grads[i], want.input_grads[i])) << label << ": input gradient " << i;
  }
  EXPECT_GT(compared, 0) << label;
}

/// A flux-tiny of 3 double and 4 single blocks in float64, with a LoRA on every Linear whose
/// factors are all non-zero (or, `lora` false, every weight training), and one batch of two
/// samples: run() is a training step's forward and backward with every gradient collected.
struct TinyFlux {
  FluxConfig config;
  Flux model{nullptr};
  std::vector<at::Tensor> inputs;
  at::Tensor timestep, guidance, loss_weight;

  explicit TinyFlux(bool lora = true) {
    torch::manual_seed(0);
    config = FluxConfig::preset("flux-tiny");
    config.num_layers = 3;
    config.num_single_layers = 4;
    model = Flux(config);
    model->to(torch::kFloat64);
    if (lora) {
      apply_lora(*model, flux_lora_target_modules("all+ffs"), 4, 4.0);
      torch::NoGradGuard g;  // LoRA B starts at zero: give it values so its gradients are not special
      for (auto& p : lora_parameters(*model)) p.normal_(0.0, 0.1);
    }
    model->train();
    const int64_t B = 2;
    inputs = {torch::randn({B, 16, 64}, torch::kFloat64), torch::randn({B, 8, 32}, torch::kFloat64),
              torch::randn({B, 16}, torch::kFloat64)};
    timestep = torch::tensor({0.3, 0.8}, torch::kFloat64);
    guidance = torch::tensor({3.5, 4.0}, torch::kFloat64);
    loss_weight = torch::randn({B, 16, 64}, torch::kFloat64);
  }

  at::Tensor forward(const std::vector<at::Tensor>& in) {
    return model->forward(in[0], in[1], in[2], timestep, flux_image_ids(4, 4), flux_text_ids(8), guidance);
  }

  RunResult run() {
    return run_with_grads(*model, inputs, [this](const std::vector<at::Tensor>& in) { return forward(in); },
                          loss_weight);
  }
};

/// A five-block mageflow-tiny in float64 with a LoRA whose factors are all non-zero, and one
/// packed batch of three pictures over two samples: run() is a training step's forward and
/// backward with every gradient collected.
struct TinyMageFlowLoRA {
  MageFlow model{nullptr};
  std::vector<ImageShape> shapes = {{1, 3, 4}, {1, 2, 2}, {1, 2, 3}};
  std::vector<at::Tensor> inputs;
  at::Tensor timesteps, img_cu, txt_cu, loss_weight;

  TinyMageFlowLoRA() {
    torch::manual_seed(0);
    MageFlowConfig config = MageFlowConfig::preset("mageflow-tiny");
    config.depth = 5;
    model = MageFlow(config);
    model->to(torch::kFloat64);
    apply_lora(*model, mageflow_lora_target_modules("default"), 4, 4.0);
    {
      torch::NoGradGuard g;  // LoRA B starts at zero: give it values so its gradients are not special
      for (auto& p : lora_parameters(*model)) p.normal_(0.0, 0.1);
    }
    model->train();
    inputs = {torch::randn({1, 22, 128}, torch::kFloat64), torch::randn({1, 9, 32}, torch::kFloat64)};
    timesteps = torch::tensor({0.25, 0.75}, torch::kFloat64);
    img_cu = torch::tensor({0, 12, 22}, torch::kInt32);
    txt_cu = torch::tensor({0, 5, 9}, torch::kInt32);
    loss_weight = torch::randn({1, 22, 128}, torch::kFloat64);
  }

  RunResult run() {
    return run_with_grads(
        *model, inputs,
        [this](const std::vector<at::Tensor>& in) { return model->forward(in[0], in[1], timesteps, shapes, img_cu, txt_cu); },
        loss_weight);
  }
};

}  // namespace remat::models::test
