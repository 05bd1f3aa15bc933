// MageFlow's denoising loop on a random mageflow-tiny transformer, against the loop written out here
// from SimpleTuner's MageFlowPipeline.__call__ (pipeline.py at bc8e6ab7): torch.randn noise as tokens,
// sigmas torch.linspace(1, 1/N, N) shifted by 6 in float32, the velocity at timesteps = sigma (with a
// negative prompt, both from one fused two-sample forward), CFG-Zero*'s projection evaluated in
// float64, the Euler step; its schedule against the published
// formula; and MageFlow's 8-bit conversion (clamp, 127.5 (x + 1), truncation) against values worked
// out by hand.

#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/models/mageflow.h"
#include "remat/sample/mageflow_sampler.h"
#include "value_error.h"

namespace remat::sample {
namespace {
namespace mageflow_sampler_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;

class MageFlowSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(0);
    model_ = models::MageFlow(models::MageFlowConfig::preset("mageflow-tiny"));
    model_->eval();
    const auto& c = model_->config();
    positive_ = {torch::randn({7, c.context_in_dim}), at::Tensor()};
    negative_ = {torch::randn({4, c.context_in_dim}), at::Tensor()};
    settings_.width = 48;
    settings_.height = 32;
    settings_.num_inference_steps = 3;
    settings_.vae_scale_factor = 16;
    settings_.seed = 11;
  }

  at::Tensor velocity(const at::Tensor& tokens, const PromptEmbeddings& e, float sigma, int64_t h, int64_t w) {
    torch::NoGradGuard no_grad;
    const auto cu = [](int64_t n) { return torch::tensor(std::vector<int32_t>{0, static_cast<int32_t>(n)}); };
    return model_->forward(tokens, e.prompt_embeds.unsqueeze(0), torch::full({1}, sigma), {{1, h, w}}, cu(h * w),
                           cu(e.prompt_embeds.size(0)));
  }

  // The pipeline's CFG pass (_build_pack_ctx with batch_cfg True): the image tokens twice and the
  // positive then the negative text as two samples of one forward.
  std::pair<at::Tensor, at::Tensor> fused(const at::Tensor& tokens, const PromptEmbeddings& negative, float sigma,
                                          int64_t h, int64_t w) {
    torch::NoGradGuard no_grad;
    const int64_t L = h * w, tp = positive_.prompt_embeds.size(0), tn = negative.prompt_embeds.size(0);
    const at::Tensor out = model_->forward(
        at::cat({tokens, tokens}, 1), at::cat({positive_.prompt_embeds, negative.prompt_embeds}, 0).unsqueeze(0),
        torch::full({2}, sigma), {{1, h, w}, {1, h, w}}, torch::tensor(std::vector<int32_t>{0, int32_t(L), int32_t(2 * L)}),
        torch::tensor(std::vector<int32_t>{0, int32_t(tp), int32_t(tp + tn)}));
    return {out.narrow(1, 0, L), out.narrow(1, L, L)};
  }

  // The pipeline's loop, step by step.
  at::Tensor by_hand(double cfg, const PromptEmbeddings* negative) {
    const int64_t h = settings_.height / 16, w = settings_.width / 16, C = model_->config().in_channels;
    at::Generator g = at::detail::createCPUGenerator(settings_.seed);
    at::Tensor tokens = torch::randn({1, C, h, w}, g).permute({0, 2, 3, 1}).reshape({1, h * w, C});
    const int64_t n = settings_.num_inference_steps;
    std::vector<float> sigmas;
    const at::Tensor inputs = torch::linspace(1.0, 1.0 / n, n);
    for (int64_t i = 0; i < n; ++i) {
      const float s = inputs[i].item<float>();
      sigmas.push_back(6.0f * s / (1.0f + 5.0f * s));
    }
    sigmas.push_back(0.0f);
    for (int64_t i = 0; i < n; ++i) {
      at::Tensor v = velocity(tokens, positive_, sigmas[i], h, w);
      if (negative != nullptr && cfg > 1) {
        const auto [fused_v, u] = fused(tokens, *negative, sigmas[i], h, w);
        v = fused_v;
        const double alpha = (v.to(at::kDouble) * u.to(at::kDouble)).sum().item<double>() /
                             ((u.to(at::kDouble) * u.to(at::kDouble)).sum().item<double>() + 1e-8);
        v = u * alpha + cfg * (v - u * alpha);
      }
      tokens = tokens + (sigmas[i + 1] - sigmas[i]) * v;
    }
    return tokens.reshape({h, w, C}).permute({2, 0, 1});
  }

  models::MageFlow model_{nullptr};
  PromptEmbeddings positive_, negative_;
  SamplingSettings settings_;
};

TEST_F(MageFlowSamplerTest, TheScheduleIsLinspaceShiftedBySix) {
  const auto schedule = mageflow_schedule(mageflow_default_scheduler(), 4);
  ASSERT_EQ(schedule.sigmas.size(0), 5);
  const double inputs[] = {1.0, 0.75, 0.5, 0.25};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(schedule.sigmas[i].item<float>(), 6 * inputs[i] / (1 + 5 * inputs[i]), 1e-6) << i;
    EXPECT_NEAR(schedule.timesteps[i].item<float>(), 1000 * 6 * inputs[i] / (1 + 5 * inputs[i]), 1e-3) << i;
  }
  EXPECT_EQ(schedule.sigmas[4].item<float>(), 0.0f);
  FlowMatchSchedulerConfig dynamic = mageflow_default_scheduler();
  dynamic.use_dynamic_shifting = true;
  EXPECT_NE(error_of([&] { mageflow_schedule(dynamic, 4); }).find("use_dynamic_shifting"), std::string::npos);
}

TEST_F(MageFlowSamplerTest, TheLoopIsThePipelines) {
  const at::Tensor plain = denoise(*model_, mageflow_default_scheduler(), positive_, nullptr, settings_);
  EXPECT_EQ(plain.sizes(), (std::vector<int64_t>{128, 2, 3}));
  EXPECT_TRUE(at::allclose(plain, by_hand(1.0, nullptr), 1e-5, 1e-5));
  // CFG-Zero* with a negative prompt.
  settings_.true_cfg_scale = 4.0;
  const at::Tensor guided = denoise(*model_, mageflow_default_scheduler(), positive_, &negative_, settings_);
  EXPECT_TRUE(at::allclose(guided, by_hand(4.0, &negative_), 1e-5, 1e-5));
  EXPECT_FALSE(at::allclose(guided, plain, 1e-3, 1e-3));
  // The fused pass is upstream's, not two separate forwards: the second sample of the pack gets
  // frame position 1 in RoPE, so its velocity differs from the negative prompt's own forward.
  {
    at::Generator g = at::detail::createCPUGenerator(3);
    const at::Tensor x = torch::randn({1, 6, model_->config().in_channels}, g);
    const auto [pos, neg] = fused(x, negative_, 0.5f, 2, 3);
    EXPECT_TRUE(at::allclose(pos, velocity(x, positive_, 0.5f, 2, 3), 1e-5, 1e-6));
    EXPECT_FALSE(at::allclose(neg, velocity(x, negative_, 0.5f, 2, 3), 1e-4, 1e-5));
  }
  // A scale of 1 runs no negative pass: the picture without CFG.
  settings_.true_cfg_scale = 1.0;
  EXPECT_TRUE(at::equal(denoise(*model_, mageflow_default_scheduler(), positive_, &negative_, settings_), plain));
  // Same seed, same picture; another seed, another.
  EXPECT_TRUE(at::equal(denoise(*model_, mageflow_default_scheduler(), positive_, nullptr, settings_), plain));
  settings_.seed = 12;
  EXPECT_FALSE(at::equal(denoise(*model_, mageflow_default_scheduler(), positive_, nullptr, settings_), plain));
}

TEST_F(MageFlowSamplerTest, BadInputsNameTheValue) {
  settings_.width = 40;
  std::string message = error_of([&] { denoise(*model_, mageflow_default_scheduler(), positive_, nullptr, settings_); });
  EXPECT_NE(message.find("width must be a positive multiple of 16"), std::string::npos) << message;
  EXPECT_NE(message.find("got 40"), std::string::npos) << message;
  settings_.width = 32;
  const PromptEmbeddings wide{torch::randn({3, 7}), at::Tensor()};
  message = error_of([&] { denoise(*model_, mageflow_default_scheduler(), wide, nullptr, settings_); });
  EXPECT_NE(message.find("context_in_dim"), std::string::npos) << message;
  settings_.reference_latents = torch::zeros({128, 2, 2});
  message = error_of([&] { denoise(*model_, mageflow_default_scheduler(), positive_, nullptr, settings_); });
  EXPECT_NE(message.find("not implemented"), std::string::npos) << message;
}

TEST(MageFlowPixels, ClampThenTruncate) {
  // 127.5 (x + 1): -1.5 -> clamp -1 -> 0; -0.5 -> 63.75 -> 63; 0 -> 127.5 -> 127; 0.999 -> 254.87 -> 254;
  // 1.2 -> clamp 1 -> 255. diffusers' conversion rounds instead: 0 -> 127.5 -> 128 (half to even).
  const at::Tensor decoded = torch::tensor({-1.5f, -0.5f, 0.0f, 0.999f, 1.2f}).view({1, 1, 1, 5}).expand({1, 3, 1, 5});
  const at::Tensor pixels = to_uint8_image(decoded, encoders::PixelConversion::clamp_truncate);
  ASSERT_EQ(pixels.sizes(), (std::vector<int64_t>{1, 5, 3}));
  const std::vector<int> expected{0, 63, 127, 254, 255};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(pixels[0][i][1].item<uint8_t>(), expected[static_cast<size_t>(i)]) << i;
  EXPECT_EQ(to_uint8_image(decoded, encoders::PixelConversion::diffusers_postprocess)[0][2][0].item<uint8_t>(), 128);
}

}  // namespace mageflow_sampler_test
}  // namespace
}  // namespace remat::sample
