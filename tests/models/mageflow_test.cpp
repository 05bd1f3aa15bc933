// MageFlow: keys and counts, msrope tables, the out_channels default, the timestep dtype, one block
// against plain-tensor references with per-sample attention, isolation of packed samples, and every
// checkpoint mode (with skip_layers).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "models/model_test_util.h"
#include "models/reference_ops.h"
#include "remat/io/safetensors.h"
#include "remat/models/lora.h"
#include "remat/models/mageflow.h"
#include "remat/memory.h"
#include "temp_dir.h"
#include "test_paths.h"
#include "value_error.h"

namespace remat::models {
namespace {
namespace mageflow_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using test::close;
using test::RunResult;
using namespace test::reference;

class MageFlowTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(0); }
};

// msrope angles (ΣL, d/2) as the vendored MageFlowEmbedRope (mage_layers.py) builds them, float64
// loops.
at::Tensor ref_msrope_angles(const std::vector<ImageShape>& shapes, const std::vector<int64_t>& axes) {
  std::vector<double> values;
  for (size_t idx = 0; idx < shapes.size(); ++idx) {
    const int64_t h = shapes[idx][1], w = shapes[idx][2];
    for (int64_t r = 0; r < h; ++r) {
      for (int64_t c = 0; c < w; ++c) {
        const double pos[3] = {static_cast<double>(idx), static_cast<double>(r - (h + 1) / 2),
                               static_cast<double>(c - (w + 1) / 2)};
        for (int a = 0; a < 3; ++a) {
          for (int64_t j = 0; j < axes[a] / 2; ++j) {
            // inv in float32 as the reference computes it.
            const float inv = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * j / axes[a]));
            values.push_back(static_cast<float>(pos[a] * inv));
          }
        }
      }
    }
  }
  int64_t half = 0;
  for (auto a : axes) half += a / 2;
  return torch::tensor(values, torch::kFloat64).view({-1, half});
}

TEST_F(MageFlowTest, CountsAndKeys) {
  EXPECT_EQ(parameter_count(MageFlowConfig::preset("mageflow-4b")), 4115745408LL);
  EXPECT_EQ(state_dict_key_count(MageFlowConfig::preset("mageflow-4b")), 397);
  for (const std::string name : {"mageflow-tiny", "mageflow-small"}) {
    const auto config = MageFlowConfig::preset(name);
    MageFlow model(config);
    const auto params = model->named_parameters();
    int64_t total = 0;
    for (const auto& item : params) total += item.value().numel();
    EXPECT_EQ(total, parameter_count(config)) << name;
    EXPECT_EQ(static_cast<int64_t>(params.size()), 13 + 32 * config.depth) << name;
  }
  MageFlow model(MageFlowConfig::preset("mageflow-tiny"));
  const auto params = model->named_parameters();
  const int64_t D = 64;
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"img_in.weight", {D, 128}},
      {"txt_norm.weight", {32}},
      {"txt_in.weight", {D, 32}},
      {"time_text_embed.timestep_embedder.linear_1.weight", {D, 256}},
      {"transformer_blocks.0.img_mod.1.weight", {6 * D, D}},
      {"transformer_blocks.1.txt_mod.1.bias", {6 * D}},
      {"transformer_blocks.0.attn.to_out.0.weight", {D, D}},
      {"transformer_blocks.0.attn.add_v_proj.weight", {D, D}},
      {"transformer_blocks.0.attn.norm_added_q.weight", {32}},
      {"transformer_blocks.1.img_mlp.net.0.proj.weight", {4 * D, D}},
      {"transformer_blocks.1.txt_mlp.net.2.weight", {D, 4 * D}},
      {"norm_out.linear.weight", {2 * D, D}},
      {"proj_out.weight", {128, D}},
  };
  for (const auto& [key, shape] : expected) {
    const auto* p = params.find(key);
    ASSERT_NE(p, nullptr) << key;
    EXPECT_EQ(p->sizes().vec(), shape) << key;
  }
  const auto json = R"({"hidden_size": 3072, "num_heads": 24, "depth": 12, "axes_dim": [16, 56, 56],
    "in_channels": 128, "out_channels": 128, "context_in_dim": 2560, "mlp_ratio": 4.0,
    "theta": 10000, "qkv_bias": true, "rope_type": "msrope"})";
  EXPECT_EQ(parameter_count(MageFlowConfig::from_json(json)), 4115745408LL);
  EXPECT_THROW(MageFlowConfig::preset("mageflow-8b"), c10::ValueError);
}

TEST_F(MageFlowTest, ConfigWrongTypesNameTheKey) {
  using remat::testing::error_of;
  EXPECT_EQ(error_of([] { MageFlowConfig::from_json_string(R"({"depth": "12"})"); }),
            "[MageFlowConfig] config key 'depth' must be an integer (64-bit), got \"12\"\n");
  EXPECT_EQ(error_of([] { MageFlowConfig::from_json_string(R"({"axes_dim": [16, 56, 56.0]})"); }),
            "[MageFlowConfig] config key 'axes_dim' must be a list of integers, got [16,56,56.0]\n");
  EXPECT_EQ(error_of([] { MageFlowConfig::from_json_string(R"({"out_channels": true})"); }),
            "[MageFlowConfig] config key 'out_channels' must be an integer (64-bit), got true\n");
  EXPECT_EQ(MageFlowConfig::from_json_string(R"({"out_channels": 64})").output_channels(), 64);
}

TEST_F(MageFlowTest, MsropeTablesCentredWithFramePerImage) {
  const std::vector<ImageShape> shapes = {{1, 4, 3}, {1, 5, 2}, {1, 1, 1}};
  const std::vector<int64_t> axes = {4, 6, 6};
  const auto tables = mageflow_rope_tables(shapes, axes);
  const auto angles = ref_msrope_angles(shapes, axes);
  ASSERT_EQ(tables.cos.sizes(), (std::vector<int64_t>{12 + 10 + 1, 16}));
  const auto want_cos = angles.to(torch::kFloat32).cos().repeat_interleave(2, 1);
  const auto want_sin = angles.to(torch::kFloat32).sin().repeat_interleave(2, 1);
  EXPECT_TRUE(close(tables.cos, want_cos, 1e-6, 1e-6));
  EXPECT_TRUE(close(tables.sin, want_sin, 1e-6, 1e-6));
  // Image 0, token 0 (row -2, col -2): frame lanes unrotated; image 1 frame lanes rotated by 1.
  EXPECT_FLOAT_EQ(tables.cos[0][0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(tables.cos[12][0].item<float>(), static_cast<float>(std::cos(1.0)));
  // Centre token of image 0 (row 0 = index 2, col 0 = index 1): height and width lanes unrotated.
  EXPECT_TRUE(torch::equal(tables.cos[2 * 3 + 2].narrow(0, 4, 12), torch::ones({12})));
  EXPECT_THROW(mageflow_rope_tables({{2, 4, 4}}, axes), c10::Error);
}

TEST_F(MageFlowTest, OutChannelsDefaultsTo128WhateverInChannels) {
  // SimpleTuner's wrapper defaults out_channels to 128 on its own, so a config.json that omits it
  // has proj_out (patch^2 * 128, D) even with other in_channels, and its weights must load.
  const auto config = MageFlowConfig::from_json(R"({"hidden_size": 64, "num_heads": 2, "depth": 1,
    "axes_dim": [8, 12, 12], "in_channels": 16, "context_in_dim": 32, "patch_size": 2})");
  EXPECT_FALSE(config.out_channels.has_value());
  EXPECT_EQ(config.output_channels(), 128);
  MageFlow model(config);
  EXPECT_EQ(model->img_in->weight.sizes().vec(), (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(model->proj_out->weight.sizes().vec(), (std::vector<int64_t>{2 * 2 * 128, 64}));

  // Weights shaped as the reference's for that config (out_channels 128 spelt out).
  auto shaped = config;
  shaped.out_channels = 128;
  MageFlow source(shaped);
  ASSERT_EQ(source->proj_out->weight.sizes().vec(), (std::vector<int64_t>{2 * 2 * 128, 64}));
  remat::testing::TempDir dir("remat_mageflow");
  io::save_module(dir / "transformer.safetensors", *source);
  const auto report = io::load_state_dict_into(*model, dir / "transformer.safetensors");
  EXPECT_TRUE(report.ok()) << report.describe();
  EXPECT_TRUE(torch::equal(model->proj_out->weight, source->proj_out->weight));
  EXPECT_EQ(parameter_count(config), parameter_count(shaped));
}

TEST_F(MageFlowTest, TimestepRoundedOnlyInABf16Model) {
  // The reference casts sigma to the activation dtype before its sinusoid: a float32 model sees
  // it unrounded, a bfloat16 model sees bf16(sigma), whatever dtype the timesteps come in.
  torch::NoGradGuard no_grad;
  MageFlow model(MageFlowConfig::preset("mageflow-tiny"));
  model->eval();
  const std::vector<ImageShape> shapes = {{1, 2, 3}};
  const auto img = torch::randn({1, 6, 128}), txt = torch::randn({1, 4, 32});
  const auto img_cu = torch::tensor({0, 6}, torch::kInt32), txt_cu = torch::tensor({0, 4}, torch::kInt32);
  const auto sigma = torch::tensor({0.123456f});  // not a bfloat16 value
  const auto sigma_bf16 = sigma.to(torch::kBFloat16).to(torch::kFloat32);
  auto run = [&](const at::Tensor& t, at::ScalarType dtype) {
    return model->forward(img.to(dtype), txt.to(dtype), t, shapes, img_cu, txt_cu);
  };
  EXPECT_FALSE(close(run(sigma, torch::kFloat32), run(sigma_bf16, torch::kFloat32), 1e-4, 1e-4));
  model->to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(run(sigma, torch::kBFloat16), run(sigma_bf16, torch::kBFloat16)));
}

TEST_F(MageFlowTest, BlockMatchesReferenceWithPerSampleAttention) {
  const int64_t H = 2, d = 16, D = H * d;
  MageFlowTransformerBlock block(D, H);
  block->to(torch::kFloat64);
  randomise(*block);
  const std::vector<ImageShape> shapes = {{1, 2, 3}, {1, 2, 2}};
  const std::vector<int64_t> txt_len = {3, 5}, img_len = {6, 4};
  const auto img = torch::randn({1, 10, D}, torch::kFloat64);
  const auto txt = torch::randn({1, 8, D}, torch::kFloat64);
  const auto temb = torch::randn({2, D}, torch::kFloat64);
  const std::vector<int64_t> axes = {4, 6, 6};
  const auto angles = ref_msrope_angles(shapes, axes);
  const auto samples = PackedSamples::from_cu_seqlens(torch::tensor({0, 3, 8}, torch::kInt32),
                                                      torch::tensor({0, 6, 10}, torch::kInt32), torch::kCPU);
  const auto [txt_out, img_out] = block->forward(img, txt, temb, tables_from_angles(angles), samples);

  const auto p = params_of(*block);
  std::vector<at::Tensor> img_ref, txt_ref;
  int64_t t0 = 0, i0 = 0;
  for (int b = 0; b < 2; ++b) {
    const auto x = img.narrow(1, i0, img_len[b]), c = txt.narrow(1, t0, txt_len[b]);
    const auto e = temb.narrow(0, b, 1);
    const auto m = ref_linear(p, "img_mod.1", ref_silu(e)).unsqueeze(1).chunk(6, -1);
    const auto mc = ref_linear(p, "txt_mod.1", ref_silu(e)).unsqueeze(1).chunk(6, -1);
    const auto x_mod = ref_ln(x) * (1 + m[1]) + m[0];
    const auto c_mod = ref_ln(c) * (1 + mc[1]) + mc[0];
    auto heads = [&](const at::Tensor& t) { return t.reshape({1, t.size(1), H, d}); };
    const auto ang = angles.narrow(0, i0, img_len[b]);
    const auto q = torch::cat({ref_rms(heads(ref_linear(p, "attn.add_q_proj", c_mod)), p.at("attn.norm_added_q.weight")),
                               ref_rope(ref_rms(heads(ref_linear(p, "attn.to_q", x_mod)), p.at("attn.norm_q.weight")), ang)}, 1);
    const auto k = torch::cat({ref_rms(heads(ref_linear(p, "attn.add_k_proj", c_mod)), p.at("attn.norm_added_k.weight")),
                               ref_rope(ref_rms(heads(ref_linear(p, "attn.to_k", x_mod)), p.at("attn.norm_k.weight")), ang)}, 1);
    const auto v = torch::cat({heads(ref_linear(p, "attn.add_v_proj", c_mod)), heads(ref_linear(p, "attn.to_v", x_mod))}, 1);
    const auto o = ref_attention(q, k, v);
    auto xr = x + m[2] * ref_linear(p, "attn.to_out.0", o.narrow(1, txt_len[b], img_len[b]));
    auto cr = c + mc[2] * ref_linear(p, "attn.to_add_out", o.narrow(1, 0, txt_len[b]));
    auto ff = [&](const std::string& name, const at::Tensor& h) {
      return ref_linear(p, name + ".net.2", ref_gelu(ref_linear(p, name + ".net.0.proj", h)));
    };
    xr = xr + m[5] * ff("img_mlp", ref_ln(xr) * (1 + m[4]) + m[3]);
    cr = cr + mc[5] * ff("txt_mlp", ref_ln(cr) * (1 + mc[4]) + mc[3]);
    img_ref.push_back(xr);
    txt_ref.push_back(cr);
    t0 += txt_len[b];
    i0 += img_len[b];
  }
  EXPECT_TRUE(close(img_out, torch::cat(img_ref, 1), 1e-10, 1e-10));
  EXPECT_TRUE(close(txt_out, torch::cat(txt_ref, 1), 1e-10, 1e-10));
}

class MageFlowModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(0);
    config_ = MageFlowConfig::preset("mageflow-tiny");
    config_.depth = 5;  // intervals 2 and 3 do not divide it
    model_ = MageFlow(config_);
    model_->to(torch::kFloat64);
    model_->train();
    // Sample 0: one 3x4 image and 5 text tokens; sample 1: a 2x2 target plus a 2x3 reference and
    // 4 text tokens.
    shapes_ = {{1, 3, 4}, {1, 2, 2}, {1, 2, 3}};
    inputs_ = {torch::randn({1, 22, 128}, torch::kFloat64), torch::randn({1, 9, 32}, torch::kFloat64)};
    timesteps_ = torch::tensor({0.25, 0.75}, torch::kFloat64);
    img_cu_ = torch::tensor({0, 12, 22}, torch::kInt32);
    txt_cu_ = torch::tensor({0, 5, 9}, torch::kInt32);
    loss_weight_ = torch::randn({1, 22, 128}, torch::kFloat64);
  }

  at::Tensor forward(const std::vector<at::Tensor>& in, const std::vector<int64_t>& skip = {}) {
    return model_->forward(in[0], in[1], timesteps_, shapes_, img_cu_, txt_cu_, skip);
  }
  RunResult run(const std::vector<int64_t>& skip = {}) {
    return test::run_with_grads(*model_, inputs_, [&](const auto& in) { return forward(in, skip); },
                                loss_weight_);
  }

  MageFlowConfig config_;
  MageFlow model_{nullptr};
  std::vector<ImageShape> shapes_;
  std::vector<at::Tensor> inputs_;
  at::Tensor timesteps_, img_cu_, txt_cu_, loss_weight_;
};

constexpr double kRtol = 1e-9, kAtol = 1e-11;

TEST_F(MageFlowModelTest, SamplesDoNotAttendToEachOther) {
  torch::NoGradGuard no_grad;
  model_->eval();
  const auto out = forward(inputs_);
  // Change every token and the timestep of sample 1: sample 0's output must not move.
  auto img2 = inputs_[0].clone(), txt2 = inputs_[1].clone();
  img2.narrow(1, 12, 10).normal_();
  txt2.narrow(1, 5, 4).normal_();
  timesteps_ = torch::tensor({0.25, 0.1}, torch::kFloat64);
  const auto out2 = forward({img2, txt2});
  EXPECT_TRUE(close(out2.narrow(1, 0, 12), out.narrow(1, 0, 12), 1e-12, 1e-12));
  EXPECT_FALSE(close(out2.narrow(1, 12, 10), out.narrow(1, 12, 10), 1e-3, 1e-3));
  // Sample 0 alone gives the same output as inside the pack (it is first, so its frame index is 0).
  const auto alone = model_->forward(inputs_[0].narrow(1, 0, 12), inputs_[1].narrow(1, 0, 5),
                                     timesteps_.narrow(0, 0, 1), {shapes_[0]},
                                     torch::tensor({0, 12}, torch::kInt32), torch::tensor({0, 5}, torch::kInt32));
  EXPECT_TRUE(close(alone, out.narrow(1, 0, 12), 1e-12, 1e-12));
}

TEST_F(MageFlowModelTest, EveryModeMatchesNoCheckpointing) {
  model_->set_checkpoint_plan(CheckpointPlan::off());
  const RunResult off = run();
  ASSERT_TRUE(off.param_grads.at("time_text_embed.timestep_embedder.linear_1.weight").defined());
  // The last block's text outputs are unused (only image tokens are returned), so its to_add_out
  // and txt_mlp get no gradient: 6 tensors.
  int defined = 0;
  for (const auto& [name, grad] : off.param_grads) defined += grad.defined() ? 1 : 0;
  EXPECT_EQ(defined, static_cast<int>(off.param_grads.size()) - 6);
  struct Mode {
    std::string label, backend;
    std::optional<int64_t> interval, stride;
    std::optional<Layout> layout;
  };
  const std::vector<Mode> modes = {
      {"per-block", "torch", std::nullopt, std::nullopt, std::nullopt},
      {"interval 2", "torch", 2, std::nullopt, std::nullopt},
      {"interval 3", "torch", 3, std::nullopt, std::nullopt},
      {"interval 2 stride 3", "torch", 2, 3, std::nullopt},
      {"torch-ffn", "torch-ffn", 2, std::nullopt, std::nullopt},
      {"unsloth", "unsloth", std::nullopt, std::nullopt, std::nullopt},
      {"unsloth-ffn", "unsloth-ffn", std::nullopt, std::nullopt, std::nullopt},
      {"explicit layout", "torch", std::nullopt, std::nullopt,
       Layout{{{0, 1, BlockMode::Keep}, {1, 4, BlockMode::Recompute}, {4, 5, BlockMode::Offload}}}},
  };
  for (const auto& mode : modes) {
    SCOPED_TRACE(mode.label);
    model_->set_checkpoint_plan(
        mode.layout ? CheckpointPlan::from_layouts({*mode.layout})
                    : CheckpointPlan::simpletuner(true, mode.interval, mode.stride, mode.backend));
    const RunResult got = run();
    const int compared = test::expect_same_run(got, off, kRtol, kAtol, mode.label);
    EXPECT_EQ(compared, defined + static_cast<int>(inputs_.size()));
    EXPECT_LT(got.retained_bytes, off.retained_bytes) << mode.label;
  }
  // Eval mode: plain path, same output.
  model_->eval();
  const RunResult eval = run();
  EXPECT_TRUE(close(eval.output, off.output, kRtol, kAtol));
  EXPECT_EQ(eval.retained_bytes, off.retained_bytes);
}

TEST_F(MageFlowModelTest, SkipLayersWithSegments) {
  const std::vector<int64_t> skip = {1, 3};
  model_->set_checkpoint_plan(CheckpointPlan::off());
  const RunResult off = run(skip);
  EXPECT_FALSE(close(off.output, run().output, 1e-3, 1e-3)) << "skip_layers had no effect";
  // Skipped blocks get no gradient; the others do (their image modulation at least).
  for (const auto& [name, grad] : off.param_grads) {
    const bool in_skipped = name.rfind("transformer_blocks.1.", 0) == 0 || name.rfind("transformer_blocks.3.", 0) == 0;
    if (in_skipped) {
      EXPECT_FALSE(grad.defined()) << name;
    }
    if (name.find("img_mod.1.weight") != std::string::npos) {
      EXPECT_EQ(grad.defined(), !in_skipped) << name;
    }
  }
  model_->set_checkpoint_plan(CheckpointPlan::simpletuner(true, 2, std::nullopt, "torch"));
  const RunResult got = run(skip);
  test::expect_same_run(got, off, kRtol, kAtol, "skip_layers interval 2");
  EXPECT_LT(got.retained_bytes, off.retained_bytes);
  // An explicit layout must cover the blocks that run (3 here).
  model_->set_checkpoint_plan(CheckpointPlan::from_layouts({layout_from_interval(3, 2)}));
  test::expect_same_run(run(skip), off, kRtol, kAtol, "skip_layers explicit layout");
  EXPECT_THROW(run(), c10::ValueError);
}

TEST_F(MageFlowModelTest, LoraDefaultTargetsAndInputErrors) {
  const auto names = apply_lora(*model_, mageflow_lora_target_modules("default"), 2, 2.0);
  EXPECT_EQ(names.size(), static_cast<size_t>(8 * config_.depth));
  EXPECT_NE(lora_state_dict(*model_).count("transformer.transformer_blocks.0.attn.add_q_proj.lora_A.weight"), 0u);
  try {
    model_->forward(inputs_[0], inputs_[1], timesteps_, shapes_, torch::tensor({0, 12, 21}, torch::kInt32), txt_cu_);
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("img_cu_seqlens"), std::string::npos) << e.what();
  }
  try {
    model_->forward(inputs_[0], inputs_[1], timesteps_, shapes_, img_cu_, txt_cu_, {7});
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("skip_layers"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model_->forward(inputs_[0], inputs_[1], timesteps_.narrow(0, 0, 1), shapes_, img_cu_, txt_cu_),
               c10::Error);
}

// Shapes from a file are checked with overflow-checked arithmetic before anything is sized by
// them: img_shapes of 2^32 x 2^32 wrapped h * w to 0, passed the token check for an empty image
// stream and then sized RoPE tables for 2^32 positions (22 GB before the limit); img_cu_seqlens
// ending at 2^28 allocated 2.2 GB of token indices before the check that it ends at the pack's
// token count.
TEST_F(MageFlowTest, FileShapesAreCheckedBeforeAllocating) {
  MageFlow model(MageFlowConfig::preset("mageflow-tiny"));
  const auto run = [&](const std::string& file) -> std::string {
    const auto inputs = io::SafetensorsFile::open(remat::testing::source_dir() + "/tests/data/regressions/" + file);
    const at::Tensor shapes = inputs.tensor("img_shapes");
    std::vector<ImageShape> img_shapes;
    for (int64_t i = 0; i < shapes.size(0); ++i) {
      img_shapes.push_back({shapes[i][0].item<int64_t>(), shapes[i][1].item<int64_t>(), shapes[i][2].item<int64_t>()});
    }
    memory::PeakScope scope;
    try {
      torch::NoGradGuard no_grad;
      model->forward(inputs.tensor("img"), inputs.tensor("txt"), inputs.tensor("timesteps"), img_shapes,
                     inputs.tensor("img_cu_seqlens"), inputs.tensor("txt_cu_seqlens"));
    } catch (const c10::ValueError& e) {
      EXPECT_LT(scope.peak_delta(), int64_t{16} << 20) << file << ": allocated before the check";
      return e.what();
    }
    ADD_FAILURE() << file << ": expected a c10::ValueError";
    return "";
  };
  const std::string wrapped = run("mageflow_img_shapes_2e32.safetensors");
  EXPECT_NE(wrapped.find("img_shapes[0] h x w = 4294967296 x 4294967296 overflows int64"), std::string::npos) << wrapped;
  const std::string cu = run("mageflow_img_cu_seqlens_2e28.safetensors");
  EXPECT_NE(cu.find("img_cu_seqlens must end at 4 (image tokens), got 268435456"), std::string::npos) << cu;
}

}  // namespace mageflow_test
}  // namespace
}  // namespace remat::models
