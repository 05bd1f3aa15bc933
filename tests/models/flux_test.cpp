// Flux: registered keys and parameter counts, single-block numerics against plain-tensor
// references written from diffusers' FluxTransformerBlock / FluxSingleTransformerBlock
// (src/diffusers/models/transformers/transformer_flux.py), config parsing and input validation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "models/model_test_util.h"
#include "models/reference_ops.h"
#include "remat/models/flux.h"
#include "value_error.h"
#include "test_paths.h"

namespace remat::models {
namespace {
namespace flux_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using test::close;
using namespace test::reference;

class FluxTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(0); }
};

TEST_F(FluxTest, DoubleBlockMatchesReferenceFormulas) {
  const int64_t B = 2, Ni = 6, Nt = 3, H = 2, d = 16, D = H * d;
  FluxTransformerBlock block(D, H);
  block->to(torch::kFloat64);
  randomise(*block);
  for (const auto& item : block->named_parameters()) {
    if (item.key().find("norm_") != std::string::npos) {
      torch::NoGradGuard g;
      item.value().add_(1.0);  // RMSNorm weights around 1
    }
  }
  const auto x = torch::randn({B, Ni, D}, torch::kFloat64);
  const auto c = torch::randn({B, Nt, D}, torch::kFloat64);
  const auto temb = torch::randn({B, D}, torch::kFloat64);
  auto ids = torch::zeros({Nt + Ni, 3});
  auto ida = ids.accessor<float, 2>();
  for (int64_t i = 0; i < Ni; ++i) {
    ida[Nt + i][1] = static_cast<float>(i / 3);
    ida[Nt + i][2] = static_cast<float>(i % 3);
  }
  const std::vector<int64_t> axes = {4, 6, 6};
  const auto angles = ref_rope_angles(ids, axes);
  const auto [c_out, x_out] = block->forward(x, c, temb, tables_from_angles(angles));

  const auto p = params_of(*block);
  const auto m = ref_linear(p, "norm1.linear", ref_silu(temb)).unsqueeze(1).chunk(6, -1);
  const auto mc = ref_linear(p, "norm1_context.linear", ref_silu(temb)).unsqueeze(1).chunk(6, -1);
  const auto x_mod = ref_ln(x) * (1 + m[1]) + m[0];
  const auto c_mod = ref_ln(c) * (1 + mc[1]) + mc[0];
  auto heads = [&](const at::Tensor& t) { return t.reshape({B, t.size(1), H, d}); };
  const auto q = torch::cat({ref_rms(heads(ref_linear(p, "attn.add_q_proj", c_mod)), p.at("attn.norm_added_q.weight")),
                             ref_rms(heads(ref_linear(p, "attn.to_q", x_mod)), p.at("attn.norm_q.weight"))}, 1);
  const auto k = torch::cat({ref_rms(heads(ref_linear(p, "attn.add_k_proj", c_mod)), p.at("attn.norm_added_k.weight")),
                             ref_rms(heads(ref_linear(p, "attn.to_k", x_mod)), p.at("attn.norm_k.weight"))}, 1);
  const auto v = torch::cat({heads(ref_linear(p, "attn.add_v_proj", c_mod)), heads(ref_linear(p, "attn.to_v", x_mod))}, 1);
  const auto o = ref_attention(ref_rope(q, angles), ref_rope(k, angles), v);
  const auto a_c = ref_linear(p, "attn.to_add_out", o.narrow(1, 0, Nt));
  const auto a = ref_linear(p, "attn.to_out.0", o.narrow(1, Nt, Ni));
  auto x_ref = x + m[2] * a;
  auto ff = [&](const std::string& name, const at::Tensor& h) {
    return ref_linear(p, name + ".net.2", ref_gelu(ref_linear(p, name + ".net.0.proj", h)));
  };
  x_ref = x_ref + m[5] * ff("ff", ref_ln(x_ref) * (1 + m[4]) + m[3]);
  auto c_ref = c + mc[2] * a_c;
  c_ref = c_ref + mc[5] * ff("ff_context", ref_ln(c_ref) * (1 + mc[4]) + mc[3]);

  EXPECT_TRUE(close(x_out, x_ref, 1e-10, 1e-10));
  EXPECT_TRUE(close(c_out, c_ref, 1e-10, 1e-10));
}

TEST_F(FluxTest, SingleBlockMatchesReferenceFormulas) {
  const int64_t B = 2, N = 7, H = 2, d = 16, D = H * d;
  FluxSingleTransformerBlock block(D, H);
  block->to(torch::kFloat64);
  randomise(*block);
  const auto s = torch::randn({B, N, D}, torch::kFloat64);
  const auto temb = torch::randn({B, D}, torch::kFloat64);
  auto ids = torch::zeros({N, 3});
  auto ida = ids.accessor<float, 2>();
  for (int64_t i = 2; i < N; ++i) {
    ida[i][1] = static_cast<float>((i - 2) / 2);
    ida[i][2] = static_cast<float>((i - 2) % 2 + 5);
  }
  const std::vector<int64_t> axes = {4, 6, 6};
  const auto angles = ref_rope_angles(ids, axes);
  const auto out = block->forward(s, temb, tables_from_angles(angles));

  const auto p = params_of(*block);
  const auto m = ref_linear(p, "norm.linear", ref_silu(temb)).unsqueeze(1).chunk(3, -1);
  const auto s_mod = ref_ln(s) * (1 + m[1]) + m[0];
  auto heads = [&](const at::Tensor& t) { return t.reshape({B, N, H, d}); };
  const auto q = ref_rope(ref_rms(heads(ref_linear(p, "attn.to_q", s_mod)), p.at("attn.norm_q.weight")), angles);
  const auto k = ref_rope(ref_rms(heads(ref_linear(p, "attn.to_k", s_mod)), p.at("attn.norm_k.weight")), angles);
  const auto v = heads(ref_linear(p, "attn.to_v", s_mod));
  const auto attn = ref_attention(q, k, v);
  const auto mlp = ref_gelu(ref_linear(p, "proj_mlp", s_mod));
  const auto ref = s + m[2] * ref_linear(p, "proj_out", torch::cat({attn, mlp}, -1));
  EXPECT_TRUE(close(out, ref, 1e-10, 1e-10));
}

// float -> bfloat16 -> float, round-to-nearest-even.
double round_bf16(double v) {
  float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST_F(FluxTest, TimestepTimes1000InActivationDtype) {
  Flux model(FluxConfig::preset("flux-tiny"));
  model->to(torch::kFloat64);
  randomise(*model);
  const auto t = torch::tensor({0.123, 0.777}, torch::kFloat64);
  const auto g = torch::tensor({3.3, 4.1}, torch::kFloat64);
  const auto pooled = torch::randn({2, 16}, torch::kFloat64);
  // Activations in bfloat16: t and g are rounded to bfloat16, multiplied by 1000 in bfloat16.
  const auto temb = model->time_text_embedding(t, g, pooled, torch::kBFloat16);
  const auto p = params_of(*model);
  auto sinusoid = [](const at::Tensor& values) {
    auto out = torch::empty({values.size(0), 256}, torch::kFloat64);
    for (int64_t b = 0; b < values.size(0); ++b) {
      const double scaled = round_bf16(round_bf16(values[b].item<double>()) * 1000.0);
      for (int64_t k = 0; k < 128; ++k) {
        const double arg = scaled * std::exp(-std::log(10000.0) * k / 128.0);
        out[b][k] = std::cos(arg);
        out[b][128 + k] = std::sin(arg);
      }
    }
    return out;
  };
  auto mlp = [&](const std::string& name, const at::Tensor& x) {
    return ref_linear(p, name + ".linear_2", ref_silu(ref_linear(p, name + ".linear_1", x)));
  };
  const auto want = mlp("time_text_embed.timestep_embedder", sinusoid(t)) +
                    mlp("time_text_embed.guidance_embedder", sinusoid(g)) +
                    mlp("time_text_embed.text_embedder", pooled);
  EXPECT_TRUE(close(temb, want, 0, 1e-3));
  // float32 activations keep t unrounded, which moves the embedding measurably.
  EXPECT_FALSE(close(model->time_text_embedding(t, g, pooled, torch::kFloat32), want, 0, 1e-3));
}

TEST_F(FluxTest, ParameterCountsOfPublishedModels) {
  EXPECT_EQ(parameter_count(FluxConfig::preset("flux-dev")), 11901408320LL);
  EXPECT_EQ(parameter_count(FluxConfig::preset("flux-schnell")), 11891178560LL);
  EXPECT_EQ(state_dict_key_count(FluxConfig::preset("flux-dev")), 1160);
  EXPECT_EQ(state_dict_key_count(FluxConfig::preset("flux-schnell")), 1156);
}

TEST_F(FluxTest, TinyModelRegistersDiffusersKeys) {
  for (const std::string name : {"flux-tiny", "flux-small"}) {
    const auto config = FluxConfig::preset(name);
    Flux model(config);
    const auto params = model->named_parameters();
    int64_t total = 0;
    for (const auto& item : params) total += item.value().numel();
    EXPECT_EQ(total, parameter_count(config)) << name;
    // diffusers' key set: 20 top-level keys with guidance, 32 per double block, 14 per single
    // block.
    EXPECT_EQ(static_cast<int64_t>(params.size()),
              20 + 32 * config.num_layers + 14 * config.num_single_layers)
        << name;
    EXPECT_EQ(static_cast<int64_t>(params.size()), state_dict_key_count(config)) << name;
  }
  const auto config = FluxConfig::preset("flux-tiny");
  Flux model(config);
  const auto params = model->named_parameters();
  const int64_t D = 64, F = 256, d = 32;
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"x_embedder.weight", {D, 64}},
      {"context_embedder.weight", {D, 32}},
      {"time_text_embed.timestep_embedder.linear_1.weight", {D, 256}},
      {"time_text_embed.guidance_embedder.linear_2.bias", {D}},
      {"time_text_embed.text_embedder.linear_1.weight", {D, 16}},
      {"transformer_blocks.0.norm1.linear.weight", {6 * D, D}},
      {"transformer_blocks.1.norm1_context.linear.bias", {6 * D}},
      {"transformer_blocks.0.attn.to_out.0.weight", {D, D}},
      {"transformer_blocks.0.attn.to_add_out.bias", {D}},
      {"transformer_blocks.0.attn.norm_added_k.weight", {d}},
      {"transformer_blocks.1.ff.net.0.proj.weight", {F, D}},
      {"transformer_blocks.1.ff_context.net.2.weight", {D, F}},
      {"single_transformer_blocks.0.norm.linear.weight", {3 * D, D}},
      {"single_transformer_blocks.1.attn.norm_k.weight", {d}},
      {"single_transformer_blocks.1.proj_mlp.weight", {F, D}},
      {"single_transformer_blocks.1.proj_out.weight", {D, D + F}},
      {"norm_out.linear.weight", {2 * D, D}},
      {"proj_out.weight", {64, D}},
  };
  for (const auto& [key, shape] : expected) {
    const auto* p = params.find(key);
    ASSERT_NE(p, nullptr) << key;
    EXPECT_EQ(p->sizes().vec(), shape) << key;
  }
  EXPECT_EQ(params.find("single_transformer_blocks.0.attn.to_out.0.weight"), nullptr);
  EXPECT_EQ(params.find("single_transformer_blocks.0.attn.add_q_proj.weight"), nullptr);
}

TEST_F(FluxTest, ConfigFromDiffusersJson) {
  const std::string json = R"({"_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.30.0",
    "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56], "guidance_embeds": false,
    "in_channels": 64, "joint_attention_dim": 4096, "num_attention_heads": 24, "num_layers": 19,
    "num_single_layers": 38, "out_channels": null, "patch_size": 1, "pooled_projection_dim": 768})";
  const auto config = FluxConfig::from_json(json);
  EXPECT_FALSE(config.guidance_embeds);
  EXPECT_EQ(config.output_channels(), 64);
  EXPECT_EQ(parameter_count(config), 11891178560LL);
  try {
    FluxConfig::from_json_string(R"({"num_layers": "nineteen"})");
    ADD_FAILURE() << "expected an error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("num_layers"), std::string::npos) << e.what();
  }
  try {
    FluxConfig::from_json_string(R"({"axes_dims_rope": [16, 56, 50]})");
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("axes_dims_rope"), std::string::npos) << e.what();
  }
  EXPECT_THROW(FluxConfig::preset("flux-huge"), c10::ValueError);
}

TEST_F(FluxTest, ConfigWrongTypesNameTheKey) {
  using remat::testing::error_of;
  EXPECT_EQ(error_of([] { FluxConfig::from_json_string(R"({"guidance_embeds": 1})"); }),
            "[FluxConfig] config key 'guidance_embeds' must be a boolean, got 1\n");
  EXPECT_EQ(error_of([] { FluxConfig::from_json_string(R"({"axes_dims_rope": 128})"); }),
            "[FluxConfig] config key 'axes_dims_rope' must be a list of integers, got 128\n");
  EXPECT_EQ(error_of([] { FluxConfig::from_json_string(R"({"out_channels": "64"})"); }),
            "[FluxConfig] config key 'out_channels' must be an integer (64-bit), got \"64\"\n");
  EXPECT_EQ(FluxConfig::from_json_string(R"({"out_channels": 16})").output_channels(), 16);
}

// A config.json from anywhere: sizes are bounded (remat/models/config_limits.h) before anything is
// built, integers past int64 are refused, and a 100k-deep value is refused before parsing.
TEST_F(FluxTest, ConfigJsonIsBounded) {
  using remat::testing::error_of;
  // `num_layers: 1000000000` once built layers until memory ran out.
  const std::string file = remat::testing::source_dir() + "/tests/data/regressions/flux_config_num_layers_1e9.json";
  const std::string layers = error_of([&] { FluxConfig::from_json_file(file); });
  // The file is named after the message's tag (remat::detail::parse_config_file).
  EXPECT_NE(layers.find("[flux] '" + file + "': num_layers must be in [0, 1024], got 1000000000"), std::string::npos)
      << layers;
  const std::string wide = error_of([] {
    FluxConfig::from_json_string(R"({"num_attention_heads": 65536, "attention_head_dim": 65536, "axes_dims_rope": [2]})");
  });
  EXPECT_NE(wide.find("hidden size num_attention_heads x attention_head_dim must be at most 65536"), std::string::npos)
      << wide;
  const std::string big = error_of([] { FluxConfig::from_json_string(R"({"num_layers": 18446744073709551615})"); });
  EXPECT_NE(big.find("'num_layers' must be an integer (64-bit), got 18446744073709551615"), std::string::npos) << big;
  const std::string deep = error_of([] {
    FluxConfig::from_json_string(R"({"num_layers": )" + std::string(100000, '[') + std::string(100000, ']') + "}");
  });
  EXPECT_NE(deep.find("deeper than 64 levels"), std::string::npos) << deep;
  EXPECT_NE(error_of([] { FluxConfig::from_json_string(R"({"num_layers": [[[[[[1]]]]]]})"); }).find("got [[[[[...]]]]]"),
            std::string::npos);
}

TEST_F(FluxTest, RejectsBadInputs) {
  Flux model(FluxConfig::preset("flux-tiny"));
  const auto x = torch::randn({1, 4, 64}), c = torch::randn({1, 3, 32}), pooled = torch::randn({1, 16});
  const auto t = torch::full({1}, 0.5), g = torch::full({1}, 3.5);
  const auto img_ids = flux_image_ids(2, 2), txt_ids = flux_text_ids(3);
  try {
    model->forward(x, c, pooled, t, img_ids, txt_ids);  // guidance missing on a dev-like model
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("guidance"), std::string::npos) << e.what();
  }
  try {
    model->forward(torch::randn({1, 4, 63}), c, pooled, t, img_ids, txt_ids, g);
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_states"), std::string::npos) << e.what();
  }
  try {
    model->set_checkpoint_plan(CheckpointPlan::simpletuner(true, std::nullopt, std::nullopt, "deepspeed"));
    ADD_FAILURE() << "expected an error";
  } catch (const c10::ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("deepspeed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unsloth-ffn"), std::string::npos) << msg;
  }
  EXPECT_THROW(model->set_checkpoint_plan(CheckpointPlan::simpletuner(true, 0, std::nullopt, "torch")),
               c10::ValueError);
  EXPECT_THROW(model->set_checkpoint_plan(CheckpointPlan::from_layouts({layout_keep_all(3), layout_keep_all(2)})),
               c10::ValueError);
  EXPECT_EQ(model->forward(x, c, pooled, t, img_ids, txt_ids, g).sizes(), (std::vector<int64_t>{1, 4, 64}));
}

}  // namespace flux_test
}  // namespace
}  // namespace remat::models
