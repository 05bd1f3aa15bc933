// The MageFlow family as SimpleTuner's mageflow/model.py trains and samples it: a batch of captions of
// different lengths packs each sample's own tokens (the loss against the packing written out here,
// padding never read), the flavour rules of check_user_config, and the descriptor's pipeline parts.
#include <algorithm>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/models/mageflow.h"
#include "remat/sample/mageflow_sampler.h"
#include "remat/train/family/family.h"
#include "remat/train/family/flow_matching.h"
#include "remat/train/family/transformer.h"
#include "remat/train/options/config.h"

namespace remat::train {
namespace {
namespace mageflow_family_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

TEST(MageFlowFamily, CaptionsOfDifferentLengthsPackEachSamplesOwnTokens) {
  TransformerSpec spec;
  spec.family = "mageflow";
  spec.flavour = "mageflow-tiny";
  torch::manual_seed(0);
  auto transformer = make_transformer(spec, at::kCPU);
  auto& model = dynamic_cast<models::MageFlowImpl&>(transformer->module());
  const int64_t D = model.config().context_in_dim, C = model.config().in_channels;
  const at::Tensor first = torch::randn({3, D}), second = torch::randn({5, D});
  std::vector<int64_t> lengths;
  Batch batch;
  batch.latents = torch::randn({2, C, 2, 3});
  batch.prompt_embeds = stack_prompt_embeds({first, second}, lengths);
  batch.prompt_lengths = lengths;
  ASSERT_EQ(batch.prompt_embeds.sizes(), (std::vector<int64_t>{2, 5, D}));
  ASSERT_EQ(lengths, (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(at::equal(batch.prompt_embeds[0].narrow(0, 3, 2), torch::zeros({2, D})));
  FlowMatchingOptions options;
  at::Generator g1 = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor loss = transformer->flow_matching_loss(batch, options, g1);

  // By hand: noise, then sigmas, from the generator; both samples' tokens back to back with their
  // own text tokens (3 then 5), timesteps = sigma x 1000 / 1000.
  at::Generator g2 = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor x0 = batch.latents.permute({0, 2, 3, 1}).reshape({1, 12, C});
  const at::Tensor noise = at::randn({1, 12, C}, g2, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor sigmas = sample_sigmas(2, SigmaSampling::LogitNormal, options.sigmoid_scale, options.shift, g2);
  const at::Tensor s = sigmas.repeat_interleave(6).view({1, 12, 1});
  const at::Tensor x_t = (1 - s) * x0 + s * noise;
  const at::Tensor txt = at::cat({first, second}, 0).unsqueeze(0);
  const auto cu = [](std::vector<int32_t> v) { return torch::tensor(v); };
  const at::Tensor prediction = model.forward(x_t, txt, sigmas * 1000 / 1000, {{1, 2, 3}, {1, 2, 3}},
                                              cu({0, 6, 12}), cu({0, 3, 8}));
  const at::Tensor expected = at::mse_loss(prediction, noise - x0);
  EXPECT_TRUE(at::allclose(loss, expected, 1e-6, 1e-7)) << loss.item<float>() << " vs " << expected.item<float>();

  // The padding is never read; reading it as tokens would give another loss.
  Batch junk = batch;
  junk.prompt_embeds = batch.prompt_embeds.clone();
  junk.prompt_embeds[0].narrow(0, 3, 2).normal_();
  at::Generator g3 = at::make_generator<at::CPUGeneratorImpl>(4);
  EXPECT_TRUE(at::equal(transformer->flow_matching_loss(junk, options, g3), loss));
  junk.prompt_lengths.clear();
  at::Generator g4 = at::make_generator<at::CPUGeneratorImpl>(4);
  EXPECT_FALSE(at::allclose(transformer->flow_matching_loss(junk, options, g4), loss));
}

TEST(MageFlowFamily, BucketsLeaveTheTextLengthOut) {
  const LatentLayout& layout = model_family("mageflow").latents;
  SampleShape a{{128, 4, 4}, {7, 32}, {}, {}}, b{{128, 4, 4}, {12, 32}, {}, {}};
  EXPECT_EQ(bucket_key(a, layout), bucket_key(b, layout));
  EXPECT_FALSE(bucket_key(a, model_family("flux").latents) == bucket_key(b, model_family("flux").latents));
}

TEST(MageFlowFamily, FlavourRulesAreSimpleTuners) {
  const ModelFamily& family = model_family("mageflow");
  EXPECT_TRUE(family.samples());
  EXPECT_TRUE(family.encodes_images());
  EXPECT_TRUE(family.guidance_is_cfg);
  EXPECT_EQ(family.pipeline_defaults.num_inference_steps, 20);
  EXPECT_EQ(family.pipeline_defaults.guidance_scale, 5.0);
  EXPECT_EQ(family.pipeline_defaults.max_sequence_length, 2048);
  EXPECT_TRUE(family.flavour("edit")->unsupported.empty());  // trains text to image, edit template
  EXPECT_FALSE(family.flavour("edit")->trains_on_pairs);
  EXPECT_EQ(family.flavour("base")->hub_id, "natalie5/Mage-Flow-Base");

  TrainConfig config;
  config.model_family = "mageflow";
  config.model_flavour = "turbo";
  auto warnings = family.apply_flavour(config, {});
  EXPECT_EQ(config.tokenizer_max_length, 2048);
  EXPECT_EQ(config.validation_num_inference_steps, 4);
  EXPECT_EQ(config.validation_guidance, 1.0);
  EXPECT_TRUE(warnings.empty());
  // What the user set stays; more than 8 turbo steps is warned about, as SimpleTuner does.
  config.tokenizer_max_length = 77;
  config.validation_num_inference_steps = 25;
  warnings = family.apply_flavour(config, {"tokenizer_max_length", "validation_num_inference_steps"});
  EXPECT_EQ(config.tokenizer_max_length, 77);
  EXPECT_EQ(config.validation_num_inference_steps, 25);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("few-step"), std::string::npos) << warnings[0];
  // No scheduler/ in the folder: MageFlowPipeline's default, shift 6 without dynamic shifting.
  const auto scheduler = family.scheduler(encoders::PipelineFolder{}, "base");
  EXPECT_EQ(scheduler.shift, 6.0);
  EXPECT_FALSE(scheduler.use_dynamic_shifting);
}

}  // namespace mageflow_family_test
}  // namespace
}  // namespace remat::train
