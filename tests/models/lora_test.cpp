// LoRA on the Flux model: PEFT matching and key names, presets, initial identity, freezing.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>

#include "models/model_test_util.h"
#include "remat/models/flux.h"
#include "remat/models/lora.h"
#include "remat/models/mageflow.h"

namespace remat::models {
namespace {
namespace lora_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using test::close;

class LoraTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(0); }
};

TEST_F(LoraTest, PeftSuffixMatching) {
  EXPECT_TRUE(lora_target_matches("transformer_blocks.0.attn.to_q", "to_q"));
  EXPECT_TRUE(lora_target_matches("to_q", "to_q"));
  EXPECT_TRUE(lora_target_matches("transformer_blocks.0.attn.to_out.0", "to_out.0"));
  EXPECT_FALSE(lora_target_matches("transformer_blocks.0.attn.add_q_proj", "q_proj"));
  EXPECT_FALSE(lora_target_matches("transformer_blocks.0.attn.to_q", "attn.to"));
}

TEST_F(LoraTest, DefaultPresetKeysAndInitialOutput) {
  Flux model(FluxConfig::preset("flux-tiny"));
  const auto x = torch::randn({1, 4, 64}), c = torch::randn({1, 3, 32}), pooled = torch::randn({1, 16});
  const auto t = torch::full({1}, 0.4), g = torch::full({1}, 3.5);
  const auto img_ids = flux_image_ids(2, 2), txt_ids = flux_text_ids(3);
  const auto base = model->forward(x, c, pooled, t, img_ids, txt_ids, g).detach();

  const auto names = apply_lora(*model, flux_lora_target_modules("default"), 4, 4.0);
  // default = to_q, to_k, to_v, to_out.0: 4 per double block, 3 per single block (no to_out).
  EXPECT_EQ(names.size(), 2u * 4 + 2u * 3);
  const auto sd = lora_state_dict(*model);
  EXPECT_EQ(sd.size(), 2 * names.size());
  for (const auto& name : names) {
    const auto a = sd.find("transformer." + name + ".lora_A.weight");
    const auto b = sd.find("transformer." + name + ".lora_B.weight");
    ASSERT_NE(a, sd.end()) << name;
    ASSERT_NE(b, sd.end()) << name;
    EXPECT_EQ(a->second.sizes(), (std::vector<int64_t>{4, 64})) << name;
    EXPECT_EQ(b->second.sizes(), (std::vector<int64_t>{64, 4})) << name;
  }
  EXPECT_NE(sd.find("transformer.transformer_blocks.0.attn.to_out.0.lora_A.weight"), sd.end());
  EXPECT_NE(sd.find("transformer.single_transformer_blocks.1.attn.to_q.lora_B.weight"), sd.end());
  EXPECT_EQ(sd.find("transformer.transformer_blocks.0.attn.add_q_proj.lora_A.weight"), sd.end());

  // B = 0: the LoRA model computes the base model's output exactly.
  EXPECT_TRUE(torch::equal(model->forward(x, c, pooled, t, img_ids, txt_ids, g), base));
  int trainable = 0;
  for (const auto& item : model->named_parameters()) {
    const bool is_lora = item.key().find(".lora_") != std::string::npos;
    EXPECT_EQ(item.value().requires_grad(), is_lora) << item.key();
    trainable += item.value().requires_grad() ? 1 : 0;
  }
  EXPECT_EQ(trainable, static_cast<int>(sd.size()));
  EXPECT_EQ(lora_parameters(*model).size(), sd.size());
}

TEST_F(LoraTest, PresetsMatchTheDocumentedModules) {
  auto count = [](const std::string& preset) {
    Flux model(FluxConfig::preset("flux-tiny"));
    return apply_lora(*model, flux_lora_target_modules(preset), 2, 2.0);
  };
  // flux-tiny: 2 double, 2 single blocks.
  EXPECT_EQ(count("all").size(), 2u * 8 + 2u * 3);
  EXPECT_EQ(count("context").size(), 2u * 4);
  EXPECT_EQ(count("context+ffs").size(), 2u * 6);
  // all+ffs: + 4 FF linears per double block, proj_mlp/proj_out per single block, top proj_out.
  EXPECT_EQ(count("all+ffs").size(), 2u * 12 + 2u * 5 + 1);
  EXPECT_EQ(count("all+ffs+embedder").size(), 2u * 12 + 2u * 5 + 2);
  EXPECT_EQ(count("ai-toolkit").size(), 2u * 14 + 2u * 6 + 1);
  // tiny / nano name block 7 (and 20): absent from flux-tiny, so nothing matches.
  EXPECT_THROW(count("nano"), c10::ValueError);
  Flux small(FluxConfig::preset("flux-small"));
  EXPECT_EQ(apply_lora(*small, flux_lora_target_modules("nano"), 2, 2.0),
            std::vector<std::string>{"single_transformer_blocks.7.proj_out"});
  EXPECT_EQ(mageflow_lora_target_modules("default").size(), 8u);
  try {
    flux_lora_target_modules("everything");
    ADD_FAILURE() << "expected an error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("everything"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("ai-toolkit"), std::string::npos);
  }
  EXPECT_THROW(mageflow_lora_target_modules("all"), c10::ValueError);
}

// linear_layers lists exactly the model's Linear modules (names and shapes) from the config alone,
// and lora_parameter_count equals what apply_lora adds: memory admission sizes a LoRA run of
// flux-dev with them without allocating 12B parameters.
std::vector<LinearShape> built_linears(torch::nn::Module& model) {
  std::vector<LinearShape> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto linear = std::dynamic_pointer_cast<LinearImpl>(item.value())) {
      const auto w = linear->weight;
      out.push_back({item.key(), w.size(1), w.size(0)});
    }
  }
  return out;
}

void expect_same_layers(std::vector<LinearShape> a, std::vector<LinearShape> b) {
  const auto by_name = [](const LinearShape& x, const LinearShape& y) { return x.name < y.name; };
  std::sort(a.begin(), a.end(), by_name);
  std::sort(b.begin(), b.end(), by_name);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].in_features, b[i].in_features) << a[i].name;
    EXPECT_EQ(a[i].out_features, b[i].out_features) << a[i].name;
  }
}

int64_t lora_numel(torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : lora_parameters(model)) n += p.numel();
  return n;
}

TEST_F(LoraTest, LinearLayersAndLoraCountsWithoutBuilding) {
  for (const std::string name : {"flux-tiny", "flux-small"}) {
    for (const std::string& preset : flux_lora_target_preset_names()) {
      SCOPED_TRACE(name + " " + preset);
      if (name == "flux-tiny" && (preset == "tiny" || preset == "nano")) continue;  // blocks 7 and 20 only
      Flux model(FluxConfig::preset(name));
      expect_same_layers(linear_layers(FluxConfig::preset(name)), built_linears(*model));
      const int64_t predicted = lora_parameter_count(linear_layers(FluxConfig::preset(name)),
                                                     flux_lora_target_modules(preset), 3);
      apply_lora(*model, flux_lora_target_modules(preset), 3, 3.0);
      EXPECT_EQ(predicted, lora_numel(*model));
    }
  }
  MageFlow mage(MageFlowConfig::preset("mageflow-tiny"));
  expect_same_layers(linear_layers(MageFlowConfig::preset("mageflow-tiny")), built_linears(*mage));
  const int64_t predicted = lora_parameter_count(linear_layers(MageFlowConfig::preset("mageflow-tiny")),
                                                 mageflow_lora_target_modules("default"), 2);
  apply_lora(*mage, mageflow_lora_target_modules("default"), 2, 2.0);
  EXPECT_EQ(predicted, lora_numel(*mage));
  // flux-dev, never built: rank 16 on `all` (attention of both streams): 19 double blocks x 8 +
  // 38 single blocks x 3 projections of 3072 x 3072, each 16 x (3072 + 3072).
  EXPECT_EQ(lora_parameter_count(linear_layers(FluxConfig::preset("flux-dev")), flux_lora_target_modules("all"), 16),
            (19 * 8 + 38 * 3) * 16 * (3072 + 3072));
}

}  // namespace lora_test
}  // namespace
}  // namespace remat::models
