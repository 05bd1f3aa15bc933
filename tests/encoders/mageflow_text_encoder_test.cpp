// MageFlow's prompt encoding on a tiny text_encoder folder in the real layout (Qwen3-VL's nested
// config.json, the language model under model.language_model. beside a vision key and lm_head,
// tokenizer.json beside them): the ids are the template's, cut as SimpleTuner's encode_prompt cuts
// them, and the embeddings are the model's final-normed states from the template's start index on.
// Compared once with SimpleTuner's encode_prompt over transformers (docs/MAGEFLOW_PARITY.md).
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/encoders/mageflow_text_encoder.h"
#include "remat/io/safetensors.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::encoders {
namespace {
namespace mageflow_text_encoder_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

class MageFlowTextEncoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write_demo_qwen2_tokenizer(dir_.str());
    const auto tokenizer = Qwen2Tokenizer::from_directory(dir_.str());
    Qwen3TextConfig c;
    c.vocab_size = tokenizer.vocab_size();
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    nlohmann::json config = {{"architectures", {"Qwen3VLForConditionalGeneration"}},
                             {"model_type", "qwen3_vl"},
                             {"text_config",
                              {{"vocab_size", c.vocab_size}, {"hidden_size", 32}, {"intermediate_size", 48},
                               {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                               {"head_dim", 8}, {"hidden_act", "silu"}, {"rms_norm_eps", 1e-6},
                               {"rope_theta", 5000000.0}}}};
    std::ofstream(dir_ / "config.json") << config.dump(2);
    torch::manual_seed(2);
    Qwen3TextModel model(c);
    std::vector<io::NamedTensor> tensors;
    for (const auto& item : model->named_parameters()) {
      tensors.push_back({std::string(kQwen3VlLanguageModelPrefix) + item.key(), torch::randn(item.value().sizes()) * 0.5});
    }
    tensors.push_back({"model.visual.merger.norm.weight", torch::ones({8})});
    tensors.push_back({"lm_head.weight", torch::randn({c.vocab_size, 32})});
    io::save_safetensors(dir_ / "model.safetensors", tensors);
  }
  remat::testing::TempDir dir_{"mageflow_text_encoder"};
};

TEST_F(MageFlowTextEncoderTest, EmbeddingsAreTheModelsStatesAfterTheTemplatePrefix) {
  const auto encoder = MageFlowTextEncoder::load(dir_.str(), at::kFloat);
  const std::string prompt = "a red square on a blue background";
  const auto& t = mageflow_prompt_template(false);
  EXPECT_EQ(t.start_idx, 34);
  EXPECT_EQ(mageflow_prompt_template(true).start_idx, 64);
  const std::string templated = t.apply(prompt);
  EXPECT_EQ(templated.rfind("<|im_start|>system\nDescribe the image", 0), 0u);
  EXPECT_NE(templated.find("<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n"), std::string::npos);

  const auto ids = encoder.template_ids(prompt, 2048, false);
  EXPECT_EQ(ids, encoder.tokenizer().encode(templated));
  const at::Tensor embeds = encoder.encode(prompt);
  ASSERT_EQ(embeds.size(0), static_cast<int64_t>(ids.size()) - 34);
  EXPECT_EQ(embeds.size(1), 32);
  // The model on the same ids, its states from position 34 on.
  auto model = MageFlowTextEncoder::load(dir_.str(), at::kFloat).model();
  torch::NoGradGuard no_grad;
  const at::Tensor all = model->forward(torch::tensor(ids, at::kLong).unsqueeze(0))[0];
  EXPECT_TRUE(at::equal(embeds, all.narrow(0, 34, all.size(0) - 34)));

  // tokenizer_max_length cuts the templated ids at max + start_idx, as encode_prompt's truncation.
  EXPECT_EQ(encoder.template_ids(prompt, 3, false).size(), 37u);
  EXPECT_EQ(encoder.encode(prompt, 3).size(0), 3);
  // The edit template is another text with its own prefix.
  EXPECT_NE(encoder.template_ids(prompt, 2048, true), ids);
  EXPECT_NE(remat::testing::error_of([&] { encoder.encode(prompt, 0); }).find("tokenizer_max_length"),
            std::string::npos);
}

TEST_F(MageFlowTextEncoderTest, LoadsInBf16) {
  const auto encoder = MageFlowTextEncoder::load(dir_.str(), at::kBFloat16);
  const at::Tensor embeds = encoder.encode("a cat");
  EXPECT_EQ(embeds.scalar_type(), at::kBFloat16);
  const at::Tensor f32 = MageFlowTextEncoder::load(dir_.str(), at::kFloat).encode("a cat");
  EXPECT_LT((embeds.to(at::kFloat) - f32).abs().max().item<float>(), 0.1 * f32.abs().max().item<float>());
}

}  // namespace mageflow_text_encoder_test
}  // namespace
}  // namespace remat::encoders
