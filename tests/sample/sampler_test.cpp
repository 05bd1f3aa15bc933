// The denoising loop on a random flux-tiny transformer: a one-step run against the step done by
// hand here (noise from torch.randn, packing, the transformer call, x - sigma v), true CFG's
// formula, determinism per seed, no global RNG use; and the 8-bit conversion against values
// worked out by hand.

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/models/flux.h"
#include "remat/sample/flux_sampler.h"
#include "value_error.h"

namespace remat::sample {
namespace {
namespace sampler_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;

class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(0);
    model_ = models::Flux(models::FluxConfig::preset("flux-tiny"));
    model_->eval();
    const auto& c = model_->config();
    positive_ = {torch::randn({7, c.joint_attention_dim}), torch::randn({c.pooled_projection_dim})};
    negative_ = {torch::randn({5, c.joint_attention_dim}), torch::randn({c.pooled_projection_dim})};
    settings_.width = 48;
    settings_.height = 64;
    settings_.num_inference_steps = 3;
    settings_.seed = 7;
  }

  at::Tensor run(const SamplingSettings& s, const PromptEmbeddings* negative = nullptr) {
    return denoise(*model_, FlowMatchSchedulerConfig::flux_dev(), positive_, negative, s);
  }

  // The transformer's velocity for packed latents x at sigma, as FluxPipeline calls it.
  at::Tensor velocity(const at::Tensor& x, const PromptEmbeddings& e, double sigma, double guidance, int64_t h,
                      int64_t w) {
    torch::NoGradGuard no_grad;
    return model_->forward(x, e.prompt_embeds.unsqueeze(0), e.pooled_prompt_embeds.unsqueeze(0),
                           torch::full({1}, sigma), models::flux_image_ids(h / 2, w / 2),
                           models::flux_text_ids(e.prompt_embeds.size(0)), torch::full({1}, guidance));
  }

  models::Flux model_{nullptr};
  PromptEmbeddings positive_, negative_;
  SamplingSettings settings_;
};

TEST_F(SamplerTest, OneStepIsNoiseMinusVelocity) {
  // One step: sigma 1 for every shift (1 is a fixed point), then sigma 0, so x0 = noise - v.
  settings_.num_inference_steps = 1;
  const at::Tensor got = run(settings_);
  const int64_t h = 8, w = 6;  // 2 * floor(64 / 16), 2 * floor(48 / 16)
  auto generator = at::detail::createCPUGenerator(7);
  const at::Tensor noise = at::randn({1, 16, h, w}, generator, at::kFloat);
  const at::Tensor packed = models::flux_pack_latents(noise);
  const at::Tensor v = velocity(packed, positive_, 1.0, settings_.guidance_scale, h, w);
  const at::Tensor expected = models::flux_unpack_latents(packed - v, h, w)[0];
  ASSERT_EQ(got.sizes(), expected.sizes());
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::allclose(got, expected, 1e-5, 1e-6));
}

// FLUX.1 Kontext (diffusers' FluxKontextPipeline): the reference picture's packed latents follow
// the noisy ones, with ids (1, r, c), and only the noisy tokens' prediction steps the latents. A
// reference of another size than the picture works; one step is done by hand here.
TEST_F(SamplerTest, KontextAppendsTheReferenceTokensAndKeepsTheSampledOnes) {
  settings_.num_inference_steps = 1;
  const int64_t h = 8, w = 6, rh = 4, rw = 10;
  const at::Tensor reference = torch::randn({16, rh, rw});
  settings_.reference_latents = reference;
  const at::Tensor got = run(settings_);
  auto generator = at::detail::createCPUGenerator(7);
  const at::Tensor packed = models::flux_pack_latents(at::randn({1, 16, h, w}, generator, at::kFloat));
  at::Tensor reference_ids = models::flux_image_ids(rh / 2, rw / 2);
  reference_ids.select(1, 0).fill_(1);
  at::Tensor v;
  {
    torch::NoGradGuard no_grad;
    v = model_->forward(at::cat({packed, models::flux_pack_latents(reference.unsqueeze(0))}, 1),
                        positive_.prompt_embeds.unsqueeze(0), positive_.pooled_prompt_embeds.unsqueeze(0),
                        torch::full({1}, 1.0), at::cat({models::flux_image_ids(h / 2, w / 2), reference_ids}, 0),
                        models::flux_text_ids(positive_.prompt_embeds.size(0)), torch::full({1}, settings_.guidance_scale));
  }
  ASSERT_EQ(v.size(1), h * w / 4 + rh * rw / 4);
  const at::Tensor expected = models::flux_unpack_latents(packed - v.slice(1, 0, h * w / 4), h, w)[0];
  ASSERT_EQ(got.sizes(), expected.sizes());
  EXPECT_TRUE(at::allclose(got, expected, 1e-5, 1e-6));
  // The reference changes the picture: without it the same seed gives another one.
  settings_.reference_latents = at::Tensor();
  EXPECT_FALSE(at::allclose(run(settings_), got, 1e-3, 1e-3));
  // A reference of the wrong channel count, or odd sides, is refused by name.
  settings_.reference_latents = torch::randn({8, 4, 4});
  EXPECT_NE(error_of([&] { run(settings_); }).find("reference_latents (Kontext's input picture) must be (16, h, w)"),
            std::string::npos);
  settings_.reference_latents = torch::randn({16, 3, 4});
  EXPECT_NE(error_of([&] { run(settings_); }).find("with h and w even"), std::string::npos);
}

TEST(SamplerNoiseTest, IsDiffusersNoiseForTheSeed) {
  // Recorded from diffusers' FluxPipeline on a tiny pipeline: at 64 x 48 with seed 7 it drew
  // torch.randn((1, 16, 8, 6)) from a CPU generator; these are its first values (AVX2 kernel; the
  // scalar kernel differs by at most 1e-6). denoise draws its noise exactly so (the tests above
  // rebuild it the same way).
  auto generator = at::detail::createCPUGenerator(7);
  const at::Tensor noise = at::randn({1, 16, 8, 6}, generator, at::kFloat);
  const at::Tensor token0 = models::flux_pack_latents(noise)[0][0].slice(0, 0, 6);
  const at::Tensor expected =
      torch::tensor({-0.8201345f, 0.3956312f, -0.6410915f, -0.8936554f, -0.1781926f, -0.2594989f});
  EXPECT_TRUE(at::allclose(token0, expected, 0, 2e-6)) << token0;
}

TEST_F(SamplerTest, TwoStepsFollowTheSchedule) {
  settings_.num_inference_steps = 2;
  const at::Tensor got = run(settings_);
  const int64_t h = 8, w = 6;
  const auto schedule = flow_match_schedule(FlowMatchSchedulerConfig::flux_dev(), 2, (h / 2) * (w / 2));
  auto generator = at::detail::createCPUGenerator(7);
  at::Tensor x = models::flux_pack_latents(at::randn({1, 16, h, w}, generator, at::kFloat));
  for (int64_t i = 0; i < 2; ++i) {
    const double sigma = schedule.sigmas[i].item<float>(), next = schedule.sigmas[i + 1].item<float>();
    x = x + (next - sigma) * velocity(x, positive_, sigma, settings_.guidance_scale, h, w);
  }
  EXPECT_TRUE(at::allclose(got, models::flux_unpack_latents(x, h, w)[0], 1e-4, 1e-5));
}

TEST_F(SamplerTest, SameSeedSamePictureOtherSeedOtherPicture) {
  const at::Tensor a = run(settings_);
  const at::Tensor b = run(settings_);
  EXPECT_TRUE(at::equal(a, b));
  settings_.seed = 8;
  EXPECT_FALSE(at::allclose(a, run(settings_)));
}

TEST_F(SamplerTest, LeavesTheGlobalRandomStateAlone) {
  torch::manual_seed(123);
  const at::Tensor expected = torch::randn({16});
  torch::manual_seed(123);
  run(settings_);
  EXPECT_TRUE(at::equal(torch::randn({16}), expected));
}

TEST_F(SamplerTest, TrueCfgScaleOneIsNoCfg) {
  settings_.true_cfg_scale = 1.0;
  EXPECT_TRUE(at::equal(run(settings_, &negative_), run(settings_)));
  settings_.true_cfg_scale = 3.0;
  EXPECT_FALSE(at::allclose(run(settings_, &negative_), run(settings_)));
  // A scale above 1 without a negative prompt is no CFG either (diffusers: has_neg_prompt).
  EXPECT_TRUE(at::equal(run(settings_, nullptr), run(settings_)));
}

TEST_F(SamplerTest, TrueCfgCombinesBothPredictions) {
  settings_.num_inference_steps = 1;
  settings_.true_cfg_scale = 2.5;
  const at::Tensor got = run(settings_, &negative_);
  const int64_t h = 8, w = 6;
  auto generator = at::detail::createCPUGenerator(7);
  const at::Tensor packed = models::flux_pack_latents(at::randn({1, 16, h, w}, generator, at::kFloat));
  const at::Tensor v_pos = velocity(packed, positive_, 1.0, settings_.guidance_scale, h, w);
  const at::Tensor v_neg = velocity(packed, negative_, 1.0, settings_.guidance_scale, h, w);
  const at::Tensor v = v_neg + 2.5 * (v_pos - v_neg);
  EXPECT_TRUE(at::allclose(got, models::flux_unpack_latents(packed - v, h, w)[0], 1e-5, 1e-5));
  // no_cfg_until_step past the last step: no CFG at all.
  settings_.no_cfg_until_step = 1;
  EXPECT_TRUE(at::equal(run(settings_, &negative_), run(settings_)));
}

TEST_F(SamplerTest, TheLatentGridFollowsTheVaeScaleFactor) {
  EXPECT_EQ(run(settings_).sizes(), (std::vector<int64_t>{16, 8, 6}));  // FLUX.1's VAE: H / 8
  settings_.vae_scale_factor = 2;                                        // a 2-level VAE: H / 2
  EXPECT_EQ(run(settings_).sizes(), (std::vector<int64_t>{16, 32, 24}));
  settings_.vae_scale_factor = 16;  // 48 is not a multiple of 32
  EXPECT_NE(error_of([&] { run(settings_); }).find("multiple of 32"), std::string::npos);
}

TEST_F(SamplerTest, GuidanceScaleReachesTheModel) {
  const at::Tensor a = run(settings_);
  settings_.guidance_scale = 1.0;
  EXPECT_FALSE(at::allclose(a, run(settings_)));
}

TEST_F(SamplerTest, ModelsWithoutGuidanceEmbeddingIgnoreTheGuidanceScale) {
  auto config = models::FluxConfig::preset("flux-tiny");
  config.guidance_embeds = false;  // schnell-like
  torch::manual_seed(0);
  models::Flux schnell(config);
  schnell->eval();
  const auto scheduler = FlowMatchSchedulerConfig::flux_schnell();
  const at::Tensor a = denoise(*schnell, scheduler, positive_, nullptr, settings_);
  settings_.guidance_scale = 9.0;
  EXPECT_TRUE(at::equal(a, denoise(*schnell, scheduler, positive_, nullptr, settings_)));
}

TEST_F(SamplerTest, ReportsEveryStep) {
  std::vector<std::pair<int64_t, int64_t>> calls;
  denoise(*model_, FlowMatchSchedulerConfig::flux_dev(), positive_, nullptr, settings_,
          [&](int64_t done, int64_t total) { calls.emplace_back(done, total); });
  const std::vector<std::pair<int64_t, int64_t>> expected = {{1, 3}, {2, 3}, {3, 3}};
  EXPECT_EQ(calls, expected);
}

TEST_F(SamplerTest, RunsInBfloat16) {
  model_->to(at::kBFloat16);
  PromptEmbeddings bf16 = {positive_.prompt_embeds.to(at::kBFloat16), positive_.pooled_prompt_embeds.to(at::kBFloat16)};
  const at::Tensor a = denoise(*model_, FlowMatchSchedulerConfig::flux_dev(), bf16, nullptr, settings_);
  EXPECT_EQ(a.scalar_type(), at::kFloat);
  EXPECT_TRUE(torch::isfinite(a).all().item<bool>());
  EXPECT_TRUE(at::equal(a, denoise(*model_, FlowMatchSchedulerConfig::flux_dev(), bf16, nullptr, settings_)));
}

TEST_F(SamplerTest, BadSizesAndEmbeddingsAreRefused) {
  settings_.width = 100;
  const std::string width = error_of([&] { run(settings_); });
  EXPECT_NE(width.find("width"), std::string::npos) << width;
  EXPECT_NE(width.find("100"), std::string::npos) << width;
  settings_.width = 48;
  settings_.height = 0;
  EXPECT_NE(error_of([&] { run(settings_); }).find("height"), std::string::npos);
  settings_.height = 64;
  settings_.num_inference_steps = 0;
  EXPECT_NE(error_of([&] { run(settings_); }).find("num_inference_steps"), std::string::npos);
  settings_.num_inference_steps = 2;
  positive_.prompt_embeds = torch::randn({7, 5});
  EXPECT_NE(error_of([&] { run(settings_); }).find("joint_attention_dim"), std::string::npos);
}

TEST(ToUint8ImageTest, RoundsHalfToEvenAfterTheClamp) {
  // Decoded values, float32 (x * 0.5 + 0.5) * 255 worked out by hand, and numpy's rounding.
  struct Case {
    float decoded;
    float scaled;  // the float32 value before rounding
    uint8_t pixel;
  };
  const std::vector<Case> cases = {
      {-0.4000000059604645f, 76.5f, 76},   // half to even: down
      {-0.48627451062202454f, 65.5f, 66},  // half to even: up
      {-0.4941176474094391f, 64.5f, 64},   // half to even: down
      {0.0f, 127.5f, 128},
      {-1.0f, 0.0f, 0},
      {1.0f, 255.0f, 255},
      {3.0f, 255.0f, 255},  // clamped
      {-7.0f, 0.0f, 0},     // clamped
      {0.1f, 140.25f, 140},
  };
  at::Tensor decoded = torch::zeros({1, 3, 1, static_cast<int64_t>(cases.size())});
  for (size_t i = 0; i < cases.size(); ++i) {
    // The hand values hold in float32.
    const float scaled = std::min(std::max(cases[i].decoded * 0.5f + 0.5f, 0.0f), 1.0f) * 255.0f;
    ASSERT_NEAR(scaled, cases[i].scaled, cases[i].decoded == 0.1f ? 1e-4 : 0.0) << i;
    for (int64_t c = 0; c < 3; ++c) decoded[0][c][0][static_cast<int64_t>(i)] = cases[i].decoded;
  }
  const at::Tensor pixels = to_uint8_image(decoded);
  ASSERT_EQ(pixels.scalar_type(), at::kByte);
  ASSERT_EQ(pixels.sizes(), (std::vector<int64_t>{1, static_cast<int64_t>(cases.size()), 3}));
  for (size_t i = 0; i < cases.size(); ++i) {
    for (int64_t c = 0; c < 3; ++c) {
      EXPECT_EQ(pixels[0][static_cast<int64_t>(i)][c].item<uint8_t>(), cases[i].pixel) << "case " << i;
    }
  }
}

TEST(ToUint8ImageTest, IsChannelsLastAndAcceptsUnbatched) {
  at::Tensor decoded = torch::full({3, 2, 4}, -1.0);
  decoded[1] = 1.0;  // green
  const at::Tensor pixels = to_uint8_image(decoded);
  ASSERT_EQ(pixels.sizes(), (std::vector<int64_t>{2, 4, 3}));
  EXPECT_TRUE(at::equal(pixels[1][3], torch::tensor({0, 255, 0}, at::kByte)));
  EXPECT_NE(error_of([] { to_uint8_image(torch::zeros({2, 3, 4, 4})); }).find("(1, 3, H, W)"), std::string::npos);
  EXPECT_NE(error_of([] { to_uint8_image(torch::zeros({4, 4, 4})); }).find("(3, H, W)"), std::string::npos);
}

}  // namespace sampler_test
}  // namespace
}  // namespace remat::sample
