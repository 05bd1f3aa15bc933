#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "remat/encoders/t5_config.h"
#include "value_error.h"

namespace {
namespace t5_config_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::encoders::T5Config;
using remat::testing::error_text;
using remat::testing::error_of;

TEST(T5Config, XxlMatchesFluxTextEncoder2) {
  const T5Config c = T5Config::t5_v1_1_xxl();
  EXPECT_EQ(c.vocab_size, 32128);
  EXPECT_EQ(c.d_model, 4096);
  EXPECT_EQ(c.d_kv, 64);
  EXPECT_EQ(c.num_heads, 64);
  EXPECT_EQ(c.d_ff, 10240);
  EXPECT_EQ(c.num_layers, 24);
  EXPECT_EQ(c.relative_attention_num_buckets, 32);
  EXPECT_EQ(c.relative_attention_max_distance, 128);
  EXPECT_DOUBLE_EQ(c.layer_norm_epsilon, 1e-6);
  EXPECT_EQ(c.dense_act_fn, "gelu_new");
  EXPECT_TRUE(c.is_gated_act);
}

// The published size of google/t5-v1_1-xxl's encoder as Flux ships it: its safetensors index
// lists total_size 9,524,621,312 bytes of bf16, i.e. 4,762,310,656 parameters. Recomputed here
// term by term from the key list (docs/T5.md, "Model and keys"; transformers'
// src/transformers/models/t5/modeling_t5.py, T5EncoderModel), independently of parameter_count's
// formula.
TEST(T5Config, XxlParameterCountIsThePublishedOne) {
  const int64_t V = 32128, D = 4096, inner = 64 * 64, F = 10240, L = 24;
  const int64_t per_block = 3 * inner * D /*q,k,v*/ + D * inner /*o*/ + D /*norm*/ +
                            2 * F * D /*wi_0, wi_1*/ + D * F /*wo*/ + D /*norm*/;
  const int64_t by_keys = V * D + L * per_block + 32 * 64 /*bias table*/ + D /*final norm*/;
  EXPECT_EQ(by_keys, 4762310656);
  EXPECT_EQ(parameter_count(T5Config::t5_v1_1_xxl()), 4762310656);
  EXPECT_EQ(2 * parameter_count(T5Config::t5_v1_1_xxl()), 9524621312);  // bf16 bytes
  EXPECT_EQ(parameter_count(T5Config::tiny()), 27680);
}

TEST(T5Config, ReadsTransformersConfigJson) {
  // The shape of a transformers config.json of T5 v1.1 XXL (labels included).
  const std::string json = R"({
    "_name_or_path": "google/t5-v1_1-xxl", "architectures": ["T5EncoderModel"],
    "classifier_dropout": 0.0, "d_ff": 10240, "d_kv": 64, "d_model": 4096,
    "decoder_start_token_id": 0, "dense_act_fn": "gelu_new", "dropout_rate": 0.1,
    "eos_token_id": 1, "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0,
    "is_encoder_decoder": true, "is_gated_act": true, "layer_norm_epsilon": 1e-06,
    "model_type": "t5", "num_decoder_layers": 24, "num_heads": 64, "num_layers": 24,
    "output_past": true, "pad_token_id": 0, "relative_attention_max_distance": 128,
    "relative_attention_num_buckets": 32, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": true,
    "vocab_size": 32128})";
  EXPECT_EQ(T5Config::from_json_text(json), T5Config::t5_v1_1_xxl());
}

TEST(T5Config, FeedForwardProjDerivesTheActivation) {
  auto parse = [](const std::string& proj) {
    return T5Config::from_json_text(R"({"feed_forward_proj": ")" + proj + R"("})");
  };
  EXPECT_EQ(parse("relu").dense_act_fn, "relu");
  EXPECT_FALSE(parse("relu").is_gated_act);
  EXPECT_EQ(parse("gated-gelu").dense_act_fn, "gelu_new");  // upstream's compatibility rule
  EXPECT_TRUE(parse("gated-gelu").is_gated_act);
  EXPECT_EQ(parse("gated-gelu_new").dense_act_fn, "gelu_new");
  EXPECT_EQ(parse("gelu").dense_act_fn, "gelu");
  EXPECT_FALSE(parse("gelu").is_gated_act);
  // Explicit keys override the derived values, as in transformers.
  const T5Config c = T5Config::from_json_text(R"({"feed_forward_proj": "gated-gelu", "dense_act_fn": "relu"})");
  EXPECT_EQ(c.dense_act_fn, "relu");
  EXPECT_TRUE(c.is_gated_act);
  EXPECT_EQ(T5Config::from_json_text("{}").feed_forward_proj, "relu");  // transformers' default
}

TEST(T5Config, RoundTripsThroughToJson) {
  for (const T5Config& c : {T5Config::t5_v1_1_xxl(), T5Config::tiny()}) {
    const std::string text = c.to_json();
    EXPECT_NE(text.find(R"("architectures": [)"), std::string::npos) << text;
    EXPECT_NE(text.find(R"("T5EncoderModel")"), std::string::npos) << text;
    EXPECT_NE(text.find(R"("model_type": "t5")"), std::string::npos) << text;
    EXPECT_EQ(T5Config::from_json_text(text), c);
  }
}

// to_json's bytes, as transformers' to_json_string writes a T5Config (sorted keys, indent 2).
TEST(T5Config, ToJsonTextIsStable) {
  EXPECT_EQ(T5Config::tiny().to_json(), R"({
  "architectures": [
    "T5EncoderModel"
  ],
  "d_ff": 64,
  "d_kv": 8,
  "d_model": 32,
  "decoder_start_token_id": 0,
  "dense_act_fn": "gelu_new",
  "dropout_rate": 0.1,
  "eos_token_id": 1,
  "feed_forward_proj": "gated-gelu",
  "initializer_factor": 1.0,
  "is_encoder_decoder": true,
  "is_gated_act": true,
  "layer_norm_epsilon": 1e-06,
  "model_type": "t5",
  "num_decoder_layers": 2,
  "num_heads": 4,
  "num_layers": 2,
  "pad_token_id": 0,
  "relative_attention_max_distance": 128,
  "relative_attention_num_buckets": 32,
  "tie_word_embeddings": false,
  "use_cache": true,
  "vocab_size": 216
}
)");
}

// A config with every field away from its default comes back equal, and == sees each field.
TEST(T5Config, EveryFieldRoundTripsAndCounts) {
  T5Config c;
  c.vocab_size = 100;
  c.d_model = 48;
  c.d_kv = 12;
  c.d_ff = 96;
  c.num_layers = 3;
  c.num_decoder_layers = 5;
  c.num_heads = 4;
  c.relative_attention_num_buckets = 16;
  c.relative_attention_max_distance = 64;
  c.layer_norm_epsilon = 1e-5;
  c.dropout_rate = 0.0;
  c.feed_forward_proj = "gated-relu";
  c.dense_act_fn = "gelu";  // an explicit key that overrides the derived relu
  c.is_gated_act = false;   // and the derived true
  c.pad_token_id = 7;
  c.eos_token_id = 9;
  const T5Config back = T5Config::from_json_text(c.to_json());
  EXPECT_EQ(back, c);
  EXPECT_EQ(back.num_decoder_layers, 5);
  EXPECT_EQ(back.dense_act_fn, "gelu");
  EXPECT_FALSE(back.is_gated_act);
  EXPECT_EQ(back.eos_token_id, 9);
  const std::vector<void (*)(T5Config&)> changes = {
      [](T5Config& x) { x.vocab_size += 1; },
      [](T5Config& x) { x.d_model += 1; },
      [](T5Config& x) { x.d_kv += 1; },
      [](T5Config& x) { x.d_ff += 1; },
      [](T5Config& x) { x.num_layers += 1; },
      [](T5Config& x) { x.num_decoder_layers += 1; },
      [](T5Config& x) { x.num_heads += 1; },
      [](T5Config& x) { x.relative_attention_num_buckets += 1; },
      [](T5Config& x) { x.relative_attention_max_distance += 1; },
      [](T5Config& x) { x.layer_norm_epsilon *= 2; },
      [](T5Config& x) { x.dropout_rate += 0.5; },
      [](T5Config& x) { x.feed_forward_proj = "relu"; },
      [](T5Config& x) { x.dense_act_fn = "relu"; },
      [](T5Config& x) { x.is_gated_act = true; },
      [](T5Config& x) { x.pad_token_id += 1; },
      [](T5Config& x) { x.eos_token_id += 1; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    T5Config other = c;
    changes[i](other);
    EXPECT_FALSE(other == c) << "change " << i;
  }
  // Without num_decoder_layers the decoder mirrors the encoder (transformers' default).
  EXPECT_EQ(T5Config::from_json_text(R"({"num_layers": 3, "num_decoder_layers": null})").num_decoder_layers, 3);
}

TEST(T5Config, WrongTypesNameTheKey) {
  EXPECT_EQ(error_text([] { T5Config::from_json_text(R"({"is_gated_act": "yes"})", "cfg.json"); }),
            "[t5] cfg.json: config key 'is_gated_act' must be a boolean, got \"yes\"");
  EXPECT_EQ(error_text([] { T5Config::from_json_text(R"({"feed_forward_proj": 3})", "cfg.json"); }),
            "[t5] cfg.json: config key 'feed_forward_proj' must be a string, got 3");
  EXPECT_EQ(error_text([] { T5Config::from_json_text(R"({"num_decoder_layers": 2.5})", "cfg.json"); }),
            "[t5] cfg.json: config key 'num_decoder_layers' must be an integer (64-bit), got 2.5");
}

TEST(T5Config, FromFileNamesTheFileInErrors) {
  const std::string path = ::testing::TempDir() + "t5_config_test_config.json";
  std::ofstream(path) << R"({"d_model": 64, "feed_forward_proj": "gated-swish"})";
  EXPECT_EQ(error_text([&] { T5Config::from_file(path); }),
            "[t5] '" + path + "': feed_forward_proj 'gated-swish' is not supported; valid: relu, "
            "gelu, gelu_new, gated-relu, gated-gelu (= gated gelu_new, T5 v1.1), gated-gelu_new");
  std::ofstream(path) << R"({"d_model": 64, "feed_forward_proj": "gated-gelu"})";
  EXPECT_EQ(T5Config::from_file(path).d_model, 64);
  std::remove(path.c_str());
  EXPECT_NE(error_of([&] { T5Config::from_file(path); }).find(path), std::string::npos);
}

TEST(T5Config, RejectsBadValuesNamingTheKey) {
  EXPECT_EQ(error_text([] { T5Config::from_json_text(R"({"feed_forward_proj": "relu-gated"})", "cfg.json"); }),
            "[t5] cfg.json: feed_forward_proj 'relu-gated' is not supported; valid: relu, gelu, "
            "gelu_new, gated-relu, gated-gelu (= gated gelu_new, T5 v1.1), gated-gelu_new");
  EXPECT_EQ(error_text([] { T5Config::from_json_text(R"({"d_model": "wide"})", "cfg.json"); }),
            "[t5] cfg.json: config key 'd_model' must be an integer (64-bit), got \"wide\"");
  EXPECT_EQ(error_text([] { T5Config::from_json_text(R"({"num_heads": 0})", "cfg.json"); }),
            "[t5] cfg.json: num_heads must be a positive integer, got 0");
  // Sizes are bounded before anything is built (num_layers 100000 took 5.3 GB, then failed).
  EXPECT_EQ(error_text([] { T5Config::from_json_text(R"({"num_layers": 100000})", "cfg.json"); }),
            "[t5] cfg.json: num_layers must be at most 128 (the largest published T5 encoders stay far below), "
            "got 100000");
  EXPECT_NE(error_text([] { T5Config::from_json_text(R"({"d_ff": 1000000000})", "cfg.json"); })
                .find("d_ff must be at most 262144"),
            std::string::npos);
  EXPECT_EQ(error_text([] { T5Config::from_json_text(R"({"layer_norm_epsilon": "small"})", "cfg.json"); }),
            "[t5] cfg.json: config key 'layer_norm_epsilon' must be a number, got \"small\"");
  EXPECT_EQ(error_text([] { T5Config::from_json_text(R"({"dense_act_fn": "swish"})", "cfg.json"); }),
            "[t5] cfg.json: dense_act_fn 'swish' is not supported; valid: relu, gelu, gelu_new");
  EXPECT_NE(error_of([] { T5Config::from_json_text("[1, 2]", "cfg.json"); }).find("must be an object"),
            std::string::npos);
}

}  // namespace t5_config_test
}  // namespace
