// AutoencoderKL (Flux's VAE): every block and the whole tiny model against float64 references
// written from the formulas (vae_reference.h), diffusers' key lists and parameter counts, config
// JSON, loading errors, tiling, slicing, latent scaling and the posterior.

#include <cmath>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/encoders/autoencoder_kl.h"
#include "remat/io/safetensors.h"
#include "temp_dir.h"
#include "value_error.h"
#include "vae_reference.h"

namespace {
namespace vae_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using namespace remat::encoders;
namespace ref = remat::testing::vae;

// The bad-input message without the trailing newline c10::Error appends.
template <class Fn>
std::string error_of(Fn&& fn) {
  std::string m = remat::testing::error_of(std::forward<Fn>(fn));
  while (!m.empty() && m.back() == '\n') m.pop_back();
  return m;
}

double max_rel_err(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).abs().max() / y.abs().max().clamp_min(1e-300)).item<double>();
}

// The error reading config text as if from vae/config.json.
std::string err(const std::string& text) {
  return error_of([&] { AutoencoderKLConfig::from_json_text(text, "vae/config.json"); });
}

class VaeTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(20261203); }
};

ref::Shape shape_of(const AutoencoderKLConfig& c) {
  return {c.block_out_channels, c.layers_per_block, c.norm_num_groups, c.mid_block_add_attention, c.use_quant_conv,
          c.use_post_quant_conv};
}

// Default LibTorch init leaves GroupNorm at weight 1, bias 0 and biases small; randomising every
// parameter makes each one matter in the comparisons.
template <class M>
void randomize(M& module) {
  torch::NoGradGuard no_grad;
  for (auto& p : module->parameters()) p.copy_(torch::randn(p.sizes(), p.options()) * 0.2);
}

// ---- blocks ----
TEST_F(VaeTest, ResnetBlockMatchesTheFormulaWithAndWithoutShortcut) {
  for (auto [cin, cout] : {std::pair<int64_t, int64_t>{8, 16}, {16, 16}}) {
    ResnetBlock2D block(cin, cout, 4, VaeActivation::kSilu);
    block->to(at::kDouble);
    randomize(block);
    EXPECT_EQ(static_cast<bool>(block->conv_shortcut), cin != cout);
    const auto x = torch::randn({2, cin, 6, 5}, at::kDouble);
    const auto y = block(x);
    const auto expected = ref::resnet(ref::params_of(*block, "b"), "b", x, 4);
    EXPECT_LT(max_rel_err(y, expected), 1e-12) << cin << "->" << cout;
  }
}

TEST_F(VaeTest, GroupNormUsesEpsOneMillionthPerGroupStatistics) {
  ResnetBlock2D block(8, 8, 2, VaeActivation::kSilu);
  block->to(at::kDouble);
  randomize(block);
  // A tiny-variance input makes eps visible: 1e-5 or 1e-6 would give clearly different outputs.
  const auto x = torch::randn({1, 8, 3, 3}, at::kDouble) * 1e-3;
  const auto p = ref::params_of(*block, "b");
  const auto y = block->norm1(x);
  EXPECT_LT(max_rel_err(y, ref::group_norm_ref(x, 2, p.at("b.norm1.weight"), p.at("b.norm1.bias"), 1e-6)), 1e-10);
  EXPECT_GT(max_rel_err(y, ref::group_norm_ref(x, 2, p.at("b.norm1.weight"), p.at("b.norm1.bias"), 1e-5)), 1e-3);
}

TEST_F(VaeTest, DownsamplePadsRightAndBottomThenStridesByTwo) {
  Downsample2D down(4);
  down->to(at::kDouble);
  randomize(down);
  for (int64_t h : {8, 7}) {
    const auto x = torch::randn({2, 4, h, 6}, at::kDouble);
    const auto y = down(x);
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 4, h / 2, 3}));
    EXPECT_LT(max_rel_err(y, ref::downsample(ref::params_of(*down, "b"), "b", x)), 1e-12);
    // Symmetric padding would sample a different grid.
    const auto p = ref::params_of(*down, "b");
    const auto symmetric = ref::conv2d_ref(x, p.at("b.conv.weight"), p.at("b.conv.bias"), 2, 1, 1, 1, 1);
    EXPECT_FALSE(symmetric.sizes() == y.sizes() && max_rel_err(y, symmetric) < 1e-3);
  }
}

TEST_F(VaeTest, UpsampleIsNearestNeighbourThenConv) {
  Upsample2D up(4);
  up->to(at::kDouble);
  randomize(up);
  const auto x = torch::randn({2, 4, 3, 5}, at::kDouble);
  const auto y = up(x);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 4, 6, 10}));
  EXPECT_LT(max_rel_err(y, ref::upsample(ref::params_of(*up, "b"), "b", x)), 1e-12);
}

TEST_F(VaeTest, AttentionIsOneHeadOverPositionsWithResidual) {
  VaeAttention attn(16, 4);
  attn->to(at::kDouble);
  randomize(attn);
  const auto x = torch::randn({2, 16, 5, 7}, at::kDouble);
  const auto expected = ref::attention(ref::params_of(*attn, "b"), "b", x, 4);
  EXPECT_LT(max_rel_err(attn(x), expected), 1e-12);
  // Query chunks that do not divide the 35 positions compute the same rows.
  attn->query_chunk = 4;
  EXPECT_LT(max_rel_err(attn(x), expected), 1e-12);
}

TEST_F(VaeTest, AttentionInBf16IsCloseToFp32) {
  VaeAttention attn(16, 4);
  randomize(attn);
  const auto x = torch::randn({1, 16, 4, 4});
  const auto y32 = attn(x);
  attn->to(at::kBFloat16);
  const auto y16 = attn(x.to(at::kBFloat16));
  EXPECT_EQ(y16.scalar_type(), at::kBFloat16);
  EXPECT_LT(max_rel_err(y16, y32), 3e-2);
}

TEST_F(VaeTest, ActivationsMatchTheirFormulas) {
  const auto x = torch::linspace(-8.0, 8.0, 161, at::kDouble);
  EXPECT_LT(max_rel_err(apply_activation(x, parse_vae_activation("swish")), x / (1 + at::exp(-x))), 1e-14);
  EXPECT_LT(max_rel_err(apply_activation(x, parse_vae_activation("Mish")), x * at::tanh(at::log1p(at::exp(x)))), 1e-14);
  EXPECT_LT(max_rel_err(apply_activation(x, parse_vae_activation("gelu")), 0.5 * x * (1 + at::erf(x / std::sqrt(2.0)))),
            1e-14);
  EXPECT_TRUE(torch::equal(apply_activation(x, parse_vae_activation("relu")), x.clamp_min(0)));
  EXPECT_EQ(error_of([] { parse_vae_activation("tanh"); }),
            "[vae] act_fn must be one of silu, swish, mish, gelu, relu, got 'tanh'");
}

// ---- whole model ----
TEST_F(VaeTest, TinyModelMatchesTheReferenceCompositionInFloat64) {
  const auto config = AutoencoderKLConfig::tiny();
  AutoencoderKL vae(config);
  vae->to(at::kDouble);
  randomize(vae);
  const auto p = ref::params_of(*vae);
  const auto x = torch::rand({2, 3, 16, 12}, at::kDouble) * 2 - 1;
  const auto moments = vae->encode_moments(x);
  EXPECT_EQ(moments.sizes(), (std::vector<int64_t>{2, 8, 8, 6}));
  EXPECT_LT(max_rel_err(moments, ref::encoder(p, shape_of(config), x)), 1e-11);
  const auto z = torch::randn({2, 4, 8, 6}, at::kDouble);
  const auto image = vae->decode(z);
  EXPECT_EQ(image.sizes(), (std::vector<int64_t>{2, 3, 16, 12}));
  EXPECT_LT(max_rel_err(image, ref::decoder(p, shape_of(config), z)), 1e-11);
}

TEST_F(VaeTest, ModelWithoutAttentionOrQuantConvsWithTwoLayersMatchesTheReference) {
  auto config = AutoencoderKLConfig::tiny();
  config.block_out_channels = {8, 16, 16};
  config.mid_block_add_attention = false;
  config.use_quant_conv = false;
  config.use_post_quant_conv = false;
  config.layers_per_block = 2;
  AutoencoderKL vae(config);
  vae->to(at::kDouble);
  randomize(vae);
  const auto p = ref::params_of(*vae);
  const auto x = torch::rand({1, 3, 16, 16}, at::kDouble) * 2 - 1;
  EXPECT_LT(max_rel_err(vae->encode_moments(x), ref::encoder(p, shape_of(config), x)), 1e-11);
  const auto z = torch::randn({1, 4, 4, 4}, at::kDouble);
  EXPECT_LT(max_rel_err(vae->decode(z), ref::decoder(p, shape_of(config), z)), 1e-11);
}

TEST_F(VaeTest, TinyModelRunsInBf16CloseToFp32) {
  AutoencoderKL vae(AutoencoderKLConfig::tiny());
  randomize(vae);
  const auto x = torch::rand({1, 3, 16, 16}) * 2 - 1;
  const auto m32 = vae->encode_moments(x);
  const auto z = torch::randn({1, 4, 8, 8});
  const auto d32 = vae->decode(z);
  vae->to(at::kBFloat16);
  const auto m16 = vae->encode_moments(x.to(at::kBFloat16));
  const auto d16 = vae->decode(z.to(at::kBFloat16));
  EXPECT_EQ(m16.scalar_type(), at::kBFloat16);
  EXPECT_LT(max_rel_err(m16, m32), 5e-2);
  EXPECT_LT(max_rel_err(d16, d32), 5e-2);
}

// ---- keys and counts ----
TEST_F(VaeTest, ModuleKeysAndShapesEqualParameterShapesInDiffusersOrder) {
  for (const auto& config : {AutoencoderKLConfig::tiny(), [] {
         auto c = AutoencoderKLConfig::tiny();
         c.block_out_channels = {8, 16, 32};
         c.use_quant_conv = c.use_post_quant_conv = c.mid_block_add_attention = false;
         return c;
       }()}) {
    AutoencoderKL vae(config);
    const auto shapes = parameter_shapes(config);
    const auto params = vae->named_parameters();
    ASSERT_EQ(params.size(), shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(params[i].key(), shapes[i].first);
      EXPECT_EQ(params[i].value().sizes().vec(), shapes[i].second) << shapes[i].first;
    }
  }
}

TEST_F(VaeTest, TinyConfigHasTheDistinctiveDiffusersKeys) {
  AutoencoderKL vae(AutoencoderKLConfig::tiny());
  std::set<std::string> keys;
  for (const auto& item : vae->named_parameters()) keys.insert(item.key());
  for (const char* key : {"encoder.conv_in.weight", "encoder.down_blocks.0.resnets.0.norm1.weight",
                          "encoder.down_blocks.0.downsamplers.0.conv.weight",
                          "encoder.down_blocks.1.resnets.0.conv_shortcut.weight",
                          "encoder.mid_block.attentions.0.group_norm.bias", "encoder.mid_block.attentions.0.to_out.0.weight",
                          "encoder.mid_block.resnets.1.conv2.bias", "encoder.conv_norm_out.weight", "encoder.conv_out.bias",
                          "quant_conv.weight", "post_quant_conv.bias", "decoder.conv_in.weight",
                          "decoder.up_blocks.0.resnets.1.conv1.weight", "decoder.up_blocks.0.upsamplers.0.conv.weight",
                          "decoder.up_blocks.1.resnets.0.conv_shortcut.weight", "decoder.mid_block.attentions.0.to_q.bias",
                          "decoder.conv_norm_out.bias", "decoder.conv_out.weight"}) {
    EXPECT_EQ(keys.count(key), 1u) << key;
  }
  EXPECT_EQ(keys.count("encoder.down_blocks.1.downsamplers.0.conv.weight"), 0u);  // the last block keeps its size
  EXPECT_EQ(keys.count("decoder.up_blocks.1.upsamplers.0.conv.weight"), 0u);
  EXPECT_EQ(keys.count("encoder.down_blocks.0.resnets.0.conv_shortcut.weight"), 0u);
}

TEST_F(VaeTest, FluxKeysShapesAndPublishedParameterCount) {
  const auto config = AutoencoderKLConfig::flux();
  const auto shapes = parameter_shapes(config);
  std::map<std::string, std::vector<int64_t>> by_key(shapes.begin(), shapes.end());
  EXPECT_EQ(shapes.size(), 244u);  // diffusers' state_dict: encoder 106, decoder 138
  int64_t encoder_tensors = 0;
  for (const auto& s : shapes) encoder_tensors += s.first.rfind("encoder.", 0) == 0;
  EXPECT_EQ(encoder_tensors, 106);
  EXPECT_EQ(by_key.at("encoder.conv_in.weight"), (std::vector<int64_t>{128, 3, 3, 3}));
  EXPECT_EQ(by_key.at("encoder.conv_out.weight"), (std::vector<int64_t>{32, 512, 3, 3}));
  EXPECT_EQ(by_key.at("decoder.conv_in.weight"), (std::vector<int64_t>{512, 16, 3, 3}));
  EXPECT_EQ(by_key.at("decoder.conv_out.weight"), (std::vector<int64_t>{3, 128, 3, 3}));
  EXPECT_EQ(by_key.at("encoder.down_blocks.1.resnets.0.conv_shortcut.weight"), (std::vector<int64_t>{256, 128, 1, 1}));
  EXPECT_EQ(by_key.at("decoder.up_blocks.3.resnets.0.conv_shortcut.weight"), (std::vector<int64_t>{128, 256, 1, 1}));
  EXPECT_EQ(by_key.at("decoder.up_blocks.2.resnets.2.norm2.weight"), (std::vector<int64_t>{256}));
  EXPECT_EQ(by_key.at("encoder.mid_block.attentions.0.to_k.weight"), (std::vector<int64_t>{512, 512}));
  EXPECT_EQ(by_key.count("quant_conv.weight"), 0u);
  EXPECT_EQ(by_key.count("post_quant_conv.weight"), 0u);
  EXPECT_EQ(by_key.count("decoder.up_blocks.3.upsamplers.0.conv.weight"), 0u);
  EXPECT_EQ(parameter_count(config), 83819683);  // as diffusers' AutoencoderKL (docs/VAE.md)
  int64_t encoder_params = 0;
  for (const auto& [key, shape] : shapes) {
    if (key.rfind("encoder.", 0) == 0) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      encoder_params += n;
    }
  }
  EXPECT_EQ(encoder_params, 34274208);  // encoder 34,274,208 + decoder 49,545,475
}

TEST_F(VaeTest, DiffusersTinyPipelineVaeCounts) {
  // The VAE of the tiny diffusers pipeline the encoder parity runs used (block_out_channels
  // [32, 32, 64, 64], layers_per_block 1): 176 tensors and 1,049,603 parameters in upstream's
  // AutoencoderKL.
  auto config = AutoencoderKLConfig::flux();
  config.block_out_channels = {32, 32, 64, 64};
  config.layers_per_block = 1;
  EXPECT_EQ(parameter_shapes(config).size(), 176u);
  EXPECT_EQ(parameter_count(config), 1049603);
}

// ---- config ----
TEST_F(VaeTest, FluxConfigJsonAsPublishedParsesToTheFluxPreset) {
  const std::string text = R"({
    "_class_name": "AutoencoderKL", "_diffusers_version": "0.30.0.dev0", "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
    "force_upcast": true, "in_channels": 3, "latent_channels": 16, "latents_mean": null, "latents_std": null,
    "layers_per_block": 2, "mid_block_add_attention": true, "norm_num_groups": 32, "out_channels": 3,
    "sample_size": 1024, "scaling_factor": 0.3611, "shift_factor": 0.1159,
    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"],
    "use_post_quant_conv": false, "use_quant_conv": false})";
  const auto c = AutoencoderKLConfig::from_json_text(text, "vae/config.json");
  EXPECT_EQ(c.to_json(), AutoencoderKLConfig::flux().to_json());
  EXPECT_EQ(c.scaling_factor, 0.3611);
  EXPECT_EQ(c.shift_factor, 0.1159);
  EXPECT_EQ(c.spatial_factor(), 8);
}

TEST_F(VaeTest, ConfigJsonRoundTrips) {
  auto listed = AutoencoderKLConfig::tiny();
  listed.sample_size = {48, 48};
  listed.sample_size_is_list = true;
  listed.act_fn = "mish";
  listed.shift_factor_is_null = true;
  listed.shift_factor = 0.0;
  for (const auto& c : {AutoencoderKLConfig::flux(), AutoencoderKLConfig::tiny(), listed}) {
    const std::string text = c.to_json();
    EXPECT_NE(text.find("\"_class_name\": \"AutoencoderKL\""), std::string::npos);
    const auto back = AutoencoderKLConfig::from_json_text(text, "round-trip");
    EXPECT_EQ(back.to_json(), text);
    EXPECT_EQ(back.block_out_channels, c.block_out_channels);
    EXPECT_EQ(back.sample_size, c.sample_size);
    EXPECT_EQ(back.act_fn, c.act_fn);
    EXPECT_EQ(back.shift_factor_is_null, c.shift_factor_is_null);
    EXPECT_EQ(back.scaling_factor, c.scaling_factor);
  }
  EXPECT_NE(listed.to_json().find("\"shift_factor\": null"), std::string::npos);
}

// to_json's bytes, as diffusers' ConfigMixin.to_json_string writes them (sorted keys).
TEST_F(VaeTest, ConfigToJsonTextIsStable) {
  EXPECT_EQ(AutoencoderKLConfig::tiny().to_json(), R"({
  "_class_name": "AutoencoderKL",
  "act_fn": "silu",
  "block_out_channels": [
    32,
    64
  ],
  "down_block_types": [
    "DownEncoderBlock2D",
    "DownEncoderBlock2D"
  ],
  "force_upcast": true,
  "in_channels": 3,
  "latent_channels": 4,
  "latents_mean": null,
  "latents_std": null,
  "layers_per_block": 1,
  "mid_block_add_attention": true,
  "norm_num_groups": 8,
  "out_channels": 3,
  "sample_size": 32,
  "scaling_factor": 0.5,
  "shift_factor": 0.25,
  "up_block_types": [
    "UpDecoderBlock2D",
    "UpDecoderBlock2D"
  ],
  "use_post_quant_conv": true,
  "use_quant_conv": true
}
)");
}

// Every field away from its default survives to_json and from_json_text.
TEST_F(VaeTest, ConfigEveryFieldRoundTrips) {
  AutoencoderKLConfig c;
  c.in_channels = 4;
  c.out_channels = 2;
  c.block_out_channels = {16, 32, 48};
  c.layers_per_block = 3;
  c.latent_channels = 6;
  c.norm_num_groups = 16;
  c.act_fn = "gelu";
  c.mid_block_add_attention = false;
  c.use_quant_conv = false;
  c.use_post_quant_conv = false;
  c.scaling_factor = 0.75;
  c.shift_factor = -0.5;
  c.shift_factor_is_null = false;
  c.force_upcast = false;
  c.sample_size = {64, 96};
  c.sample_size_is_list = true;
  const auto back = AutoencoderKLConfig::from_json_text(c.to_json(), "round-trip");
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.in_channels, 4);
  EXPECT_EQ(back.out_channels, 2);
  EXPECT_EQ(back.block_out_channels, c.block_out_channels);
  EXPECT_EQ(back.layers_per_block, 3);
  EXPECT_EQ(back.latent_channels, 6);
  EXPECT_EQ(back.norm_num_groups, 16);
  EXPECT_EQ(back.act_fn, "gelu");
  EXPECT_FALSE(back.mid_block_add_attention);
  EXPECT_FALSE(back.use_quant_conv);
  EXPECT_FALSE(back.use_post_quant_conv);
  EXPECT_EQ(back.scaling_factor, 0.75);
  EXPECT_EQ(back.shift_factor, -0.5);
  EXPECT_FALSE(back.shift_factor_is_null);
  EXPECT_FALSE(back.force_upcast);
  EXPECT_EQ(back.sample_size, c.sample_size);
  EXPECT_TRUE(back.sample_size_is_list);
}

TEST_F(VaeTest, ConfigWrongTypesNameTheKey) {
  EXPECT_EQ(err(R"({"use_quant_conv": 0})"),
            "[vae] vae/config.json: config key 'use_quant_conv' must be a boolean, got 0");
  EXPECT_EQ(err(R"({"scaling_factor": "0.5"})"),
            "[vae] vae/config.json: config key 'scaling_factor' must be a number, got \"0.5\"");
  EXPECT_EQ(err(R"({"shift_factor": true})"),
            "[vae] vae/config.json: config key 'shift_factor' must be a number, got true");
  EXPECT_EQ(err(R"({"act_fn": ["silu"]})"),
            "[vae] vae/config.json: config key 'act_fn' must be a string, got [\"silu\"]");
  EXPECT_EQ(err(R"({"block_out_channels": [32, "64"]})"),
            "[vae] vae/config.json: config key 'block_out_channels' must be a list of integers, got [32,\"64\"]");
  EXPECT_EQ(err(R"({"sample_size": [32.5]})"),
            "[vae] vae/config.json: config key 'sample_size' must be a list of integers, got [32.5]");
  EXPECT_EQ(err(R"({"sample_size": "32"})"),
            "[vae] vae/config.json: config key 'sample_size' must be an integer (64-bit), got \"32\"");
}

TEST_F(VaeTest, ConfigFromFileNamesTheFileInErrors) {
  remat::testing::TempDir dir;
  const std::string path = (dir.path() / "config.json").string();
  std::ofstream(path) << R"({"act_fn": "swiglu"})";
  EXPECT_EQ(error_of([&] { AutoencoderKLConfig::from_file(path); }),
            "[vae] " + path + ": act_fn must be one of silu, swish, mish, gelu, relu, got 'swiglu'");
  std::ofstream(path) << AutoencoderKLConfig::tiny().to_json();
  EXPECT_EQ(AutoencoderKLConfig::from_file(path).to_json(), AutoencoderKLConfig::tiny().to_json());
}

TEST_F(VaeTest, ConfigErrorsNameTheOriginKeyAndValue) {
  EXPECT_EQ(err(R"({"act_fn": "tanh"})"),
            "[vae] vae/config.json: act_fn must be one of silu, swish, mish, gelu, relu, got 'tanh'");
  EXPECT_EQ(err(R"({"block_out_channels": [], "down_block_types": [], "up_block_types": []})"),
            "[vae] vae/config.json: block_out_channels must have 1 to 8 entries, got []");
  EXPECT_EQ(err(R"({"block_out_channels": [32, 48], "norm_num_groups": 32})"),
            "[vae] vae/config.json: every block_out_channels entry must be a positive multiple of norm_num_groups "
            "(32), got [32, 48]");
  EXPECT_EQ(err(R"({"latent_channels": 0})"), "[vae] vae/config.json: latent_channels must be in [1, 256], got 0");
  // Sizes are bounded before anything is built (layers_per_block 100000 built modules until
  // memory ran out): the largest published AutoencoderKLs with a wide margin.
  EXPECT_EQ(err(R"({"layers_per_block": 100000})"),
            "[vae] vae/config.json: layers_per_block must be in [1, 16], got 100000");
  EXPECT_EQ(err(R"({"block_out_channels": [1000000000, 64], "norm_num_groups": 32})"),
            "[vae] vae/config.json: every block_out_channels entry must be at most 4096, got [1000000000, 64]");
  EXPECT_EQ(err(R"({"block_out_channels": [32, 32, 32, 32, 32, 32, 32, 32, 32], "norm_num_groups": 32})"),
            "[vae] vae/config.json: block_out_channels must have 1 to 8 entries, got [32, 32, 32, 32, 32, 32, 32, 32, 32]");
  EXPECT_EQ(err(R"({"layers_per_block": "2"})"),
            "[vae] vae/config.json: config key 'layers_per_block' must be an integer (64-bit), got \"2\"");
  EXPECT_EQ(err(R"({"scaling_factor": 0})"),
            "[vae] vae/config.json: scaling_factor must be finite and non-zero, got 0.000000");
  EXPECT_EQ(err(R"({"down_block_types": ["DownBlock2D"]})"),
            "[vae] vae/config.json: config key 'down_block_types' must be a list of \"DownEncoderBlock2D\" (the only "
            "block AutoencoderKL supports), got [\"DownBlock2D\"]");
  EXPECT_EQ(err(R"({"block_out_channels": [32, 64], "up_block_types": ["UpDecoderBlock2D"]})"),
            "[vae] vae/config.json: config key 'up_block_types' must have one entry per block_out_channels entry (2), "
            "got 1");
  EXPECT_EQ(err(R"({"latents_mean": [0.1]})"),
            "[vae] vae/config.json: config key 'latents_mean' must be null (per-channel latent statistics are not "
            "supported), got [0.1]");
  EXPECT_EQ(err("[1]"), "[vae] vae/config.json: config JSON must be an object");
  EXPECT_EQ(err(R"({"sample_size": [0]})"),
            "[vae] vae/config.json: sample_size must be a positive integer (or a list of them), got [0]");
  // Case-insensitive like diffusers' get_activation.
  EXPECT_EQ(AutoencoderKLConfig::from_json_text(R"({"act_fn": "SiLU"})", "x").act_fn, "SiLU");
}

// ---- loading ----
TEST_F(VaeTest, LoadRoundTripsAndConvertsToTheRequestedDtype) {
  remat::testing::TempDir dir;
  const std::string path = (dir.path() / "vae.safetensors").string();
  AutoencoderKL vae(AutoencoderKLConfig::tiny());
  randomize(vae);
  remat::io::save_module(path, *vae);
  auto loaded = load_autoencoder_kl(path, AutoencoderKLConfig::tiny(), at::kFloat);
  const auto x = torch::rand({1, 3, 8, 8}) * 2 - 1;
  EXPECT_TRUE(torch::equal(loaded->encode_moments(x), vae->encode_moments(x)));
  auto bf16 = load_autoencoder_kl(path, AutoencoderKLConfig::tiny(), at::kBFloat16);
  EXPECT_EQ(bf16->decoder->conv_out->weight.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(torch::equal(bf16->decoder->conv_out->weight, vae->decoder->conv_out->weight.to(at::kBFloat16)));
}

TEST_F(VaeTest, StrictLoadNamesTheFileAndTheMismatchedKeys) {
  remat::testing::TempDir dir;
  const std::string path = (dir.path() / "vae.safetensors").string();
  auto other = AutoencoderKLConfig::tiny();
  other.use_post_quant_conv = false;  // the file lacks post_quant_conv.*
  other.latent_channels = 8;          // and its latent convs have the wrong shapes
  AutoencoderKL vae(other);
  remat::io::save_module(path, *vae);
  const std::string message = error_of([&] { load_autoencoder_kl(path, AutoencoderKLConfig::tiny()); });
  EXPECT_EQ(message.rfind("[vae] ", 0), 0u) << message;
  for (const char* needle : {"vae.safetensors", "post_quant_conv.weight", "post_quant_conv.bias", "quant_conv.weight",
                             "encoder.conv_out.weight", "decoder.conv_in.weight"}) {
    EXPECT_NE(message.find(needle), std::string::npos) << needle << " not in: " << message;
  }
  EXPECT_EQ(error_of([&] { load_autoencoder_kl(std::vector<std::string>{}, AutoencoderKLConfig::tiny()); }),
            "[vae] load_autoencoder_kl needs at least one safetensors file, got none");
}

// ---- tiling ----
TEST_F(VaeTest, BlendMatchesTheHandComputedCrossFade) {
  // a = 10 everywhere, b = 0: with extent 4, rows 0..3 of b become 10 * (1 - y/4).
  const auto a = torch::full({1, 1, 6, 2}, 10.0, at::kDouble);
  auto b = torch::zeros({1, 1, 5, 2}, at::kDouble);
  const auto out = blend_v(a, b, 4);
  EXPECT_EQ(out.data_ptr(), b.data_ptr());  // in place, as diffusers
  const double expected_v[5] = {10.0, 7.5, 5.0, 2.5, 0.0};
  for (int y = 0; y < 5; ++y) EXPECT_EQ(b[0][0][y][1].item<double>(), expected_v[y]) << y;
  // Extent clipped to the smaller tile: a has 2 columns, so E' = 2 and column 0 of b takes a's
  // column 0 (= a[-2]), column 1 is a[-1] / 2 + b / 2.
  const auto ah = torch::arange(10.0, at::kDouble).reshape({1, 1, 1, 10}).slice(3, 0, 2).clone();  // [0, 1]
  auto bh = torch::full({1, 1, 1, 4}, 4.0, at::kDouble);
  blend_h(ah, bh, 3);
  const double expected_h[4] = {0.0, 0.5 * 1.0 + 0.5 * 4.0, 4.0, 4.0};
  for (int x = 0; x < 4; ++x) EXPECT_EQ(bh[0][0][0][x].item<double>(), expected_h[x]) << x;
}

TEST_F(VaeTest, TiledLoopOfTheIdentityReturnsTheInput) {
  // Identity tiles: each blended row mixes two copies of the same pixel, and the crops tile the
  // image exactly, so the geometry (stride, crop, concatenation) is checked value for value.
  const auto x = torch::randn({2, 3, 11, 9}, at::kDouble);
  const auto y = tiled_apply(x, 4, 0.25, 1, 3, [](const at::Tensor& t) { return t.clone(); });
  ASSERT_EQ(y.sizes(), x.sizes());
  EXPECT_TRUE(torch::equal(y, x));
}

TEST_F(VaeTest, TilingWithATileLargerThanTheImageEqualsUntiledExactly) {
  AutoencoderKL vae(AutoencoderKLConfig::tiny());  // sample_size 32: tiles of 32 px, 16 latent px
  randomize(vae);
  const auto x = torch::rand({1, 3, 32, 24}) * 2 - 1;
  const auto z = torch::randn({1, 4, 16, 12});
  const auto m = vae->encode_moments(x);
  const auto d = vae->decode(z);
  vae->set_tiling(true);
  EXPECT_TRUE(torch::equal(vae->encode_moments(x), m));
  EXPECT_TRUE(torch::equal(vae->decode(z), d));
}

TEST_F(VaeTest, TiledEncodeAndDecodeKeepUnblendedTileRegionsExactly) {
  AutoencoderKL vae(AutoencoderKLConfig::tiny());
  randomize(vae);
  vae->set_tiling(true);
  vae->set_tile_sample_size(16);  // 16 px tiles, 8 latent px, stride 12 px / 6 latent px
  const auto& g = vae->tile_geometry();
  ASSERT_EQ(g.sample_min_size, 16);
  ASSERT_EQ(g.latent_min_size, 8);
  const auto x = torch::rand({1, 3, 24, 24}) * 2 - 1;
  const auto m = vae->encode_moments(x);
  ASSERT_EQ(m.sizes(), (std::vector<int64_t>{1, 8, 12, 12}));  // two 6-px crops per side
  // Encode: blend extent int(8 * 0.25) = 2, crop 6. Tile (0, 0) is never blended; tile (0, 1)
  // (pixels 12..27 -> 12..23) is blended only in its first 2 columns.
  const auto t00 = vae->quant_conv(vae->encoder(x.slice(2, 0, 16).slice(3, 0, 16)));
  EXPECT_TRUE(torch::equal(m.slice(2, 0, 6).slice(3, 0, 6), t00.slice(2, 0, 6).slice(3, 0, 6)));
  const auto t01 = vae->quant_conv(vae->encoder(x.slice(2, 0, 16).slice(3, 12, 28)));
  EXPECT_TRUE(torch::equal(m.slice(2, 0, 6).slice(3, 8, 12), t01.slice(2, 0, 6).slice(3, 2, 6)));
  // Blended column 0 of tile (0, 1) is exactly tile (0, 0)'s column 6 (weight 1 - 0/2).
  EXPECT_TRUE(torch::equal(m.slice(2, 0, 6).select(3, 6), t00.slice(2, 0, 6).select(3, 6)));
  // Decode: 8 latent px tiles, stride 6, blend int(16 * 0.25) = 4 px, crop 12 px.
  const auto z = torch::randn({1, 4, 12, 12});
  const auto d = vae->decode(z);
  ASSERT_EQ(d.sizes(), (std::vector<int64_t>{1, 3, 24, 24}));
  const auto d00 = vae->decoder(vae->post_quant_conv(z.slice(2, 0, 8).slice(3, 0, 8)));
  EXPECT_TRUE(torch::equal(d.slice(2, 0, 12).slice(3, 0, 12), d00.slice(2, 0, 12).slice(3, 0, 12)));
  EXPECT_EQ(error_of([&] { vae->set_tile_geometry({16, 0, 0.25}); }),
            "[vae] tile geometry must have sample_min_size >= 1, latent_min_size >= 1 and overlap_factor in [0, 1), "
            "got 16, 0, 0.250000");
}

// ---- slicing, latents, posterior ----
TEST_F(VaeTest, SlicingEqualsTheBatchedResult) {
  AutoencoderKL vae(AutoencoderKLConfig::tiny());
  randomize(vae);
  const auto x = torch::rand({3, 3, 16, 16}) * 2 - 1;
  const auto z = torch::randn({3, 4, 8, 8});
  const auto m = vae->encode_moments(x);
  const auto d = vae->decode(z);
  vae->set_slicing(true);
  const auto ms = vae->encode_moments(x), ds = vae->decode(z);
  // Per-image kernels may block the batch differently: equal to fp32 rounding, and equal
  // exactly to encoding each image on its own.
  EXPECT_LT(max_rel_err(ms, m), 1e-5);
  EXPECT_LT(max_rel_err(ds, d), 1e-5);
  for (int64_t i = 0; i < 3; ++i) {
    const auto one = vae->quant_conv(vae->encoder(x.slice(0, i, i + 1)));
    EXPECT_TRUE(torch::equal(ms.slice(0, i, i + 1), one)) << i;
  }
}

TEST_F(VaeTest, LatentScalingMatchesTheFormulaAndRoundTrips) {
  AutoencoderKL vae(AutoencoderKLConfig::flux());
  const auto z = torch::randn({1, 16, 4, 4}, at::kDouble);
  const auto latents = vae->to_transformer_latents(z);
  EXPECT_TRUE(torch::allclose(latents, (z - 0.1159) * 0.3611, 0, 1e-15));
  EXPECT_TRUE(torch::allclose(vae->from_transformer_latents(latents), z, 0, 1e-14));
  EXPECT_TRUE(torch::allclose(vae->from_transformer_latents(latents), latents / 0.3611 + 0.1159, 0, 0));
}

TEST_F(VaeTest, PosteriorClampsLogvarAndSamplesMeanPlusStdTimesNoise) {
  auto moments = torch::randn({2, 8, 3, 3});
  moments.index_put_({0, 4, 0, 0}, 50.0);
  moments.index_put_({1, 5, 1, 1}, -50.0);
  const DiagonalGaussian post(moments);
  EXPECT_TRUE(torch::equal(post.mean, moments.slice(1, 0, 4)));
  EXPECT_EQ(post.logvar[0][0][0][0].item<float>(), 20.0f);
  EXPECT_EQ(post.logvar[1][1][1][1].item<float>(), -30.0f);
  const auto lv = moments.slice(1, 4, 8).to(at::kDouble).clamp(-30, 20);
  EXPECT_LT(max_rel_err(post.std, at::exp(lv / 2)), 1e-6);
  EXPECT_LT(max_rel_err(post.var, at::exp(lv)), 1e-6);
  EXPECT_TRUE(torch::equal(post.mode(), post.mean));

  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  const auto sample = post.sample(gen);
  auto gen2 = at::make_generator<at::CPUGeneratorImpl>(1234);
  const auto eps = at::randn({2, 4, 3, 3}, gen2, at::kFloat);
  EXPECT_TRUE(torch::equal(sample, post.mean + post.std * eps));

  const auto kl = post.kl();
  const auto m = post.mean.to(at::kDouble);
  const auto expected = 0.5 * (m * m + at::exp(lv) - 1 - lv).sum({1, 2, 3});
  EXPECT_LT(max_rel_err(kl, expected), 1e-5);
}

TEST_F(VaeTest, EncodeAndDecodeRejectWrongShapes) {
  AutoencoderKL vae(AutoencoderKLConfig::tiny());
  EXPECT_EQ(error_of([&] { vae->encode(torch::zeros({1, 4, 8, 8})); }),
            "[vae] encode input must be (B, 3, H, W), got shape [1, 4, 8, 8]");
  EXPECT_EQ(error_of([&] { vae->decode(torch::zeros({1, 3, 8, 8})); }),
            "[vae] decode input must be (B, 4, h, w), got shape [1, 3, 8, 8]");
}

}  // namespace vae_test
}  // namespace
