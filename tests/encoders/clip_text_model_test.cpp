// CLIPTextModel: each block and the whole tiny model against float64 computations written here
// from the published formulas (transformers' modeling_clip.py), the pooled-token rule, keys,
// parameter counts, config files and strict loading.

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/encoders/clip_text_model.h"
#include "remat/io/safetensors.h"
#include "temp_dir.h"
#include "value_error.h"

namespace {
namespace clip_text_model_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::encoders::ClipTextConfig;
using remat::encoders::ClipTextModel;

class ClipTextModelTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(1234); }

  // Non-trivial weights: LayerNorm affine and biases random too (the default init sets them to 1 / 0).
  static void randomize(torch::nn::Module& module) {
    torch::NoGradGuard no_grad;
    for (auto& p : module.parameters()) p.normal_(0.0, 0.2);
  }
};

// transformers takes the attention softmax in fp32 whatever the activation dtype
// (softmax(..., dtype=torch.float32).to(dtype)), so a float64 run of a block with attention agrees
// with an all-float64 reference to fp32 precision only.
constexpr double kFp32SoftmaxTolerance = 1e-6;

double max_rel_err(const at::Tensor& got, const at::Tensor& want) {
  const auto g = got.to(at::kDouble), w = want.to(at::kDouble);
  return ((g - w).abs().max() / w.abs().max()).item<double>();
}

// --- float64 references from the formulas, element by element where it is cheap ---

// LayerNorm over the last dim: (x - mean) / sqrt(var_biased + eps) * w + b.
at::Tensor layer_norm_ref(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  const auto xd = x.to(at::kDouble);
  const auto mean = xd.mean(-1, true);
  const auto var = (xd - mean).pow(2).mean(-1, true);
  return (xd - mean) / (var + eps).sqrt() * w.to(at::kDouble) + b.to(at::kDouble);
}

at::Tensor linear_ref(const at::Tensor& x, const remat::models::Linear& l) {
  return at::matmul(x.to(at::kDouble), l->weight.to(at::kDouble).t()) + l->bias.to(at::kDouble);
}

// Causal multi-head attention with loops over batch, head, query and key: for query i only keys
// j <= i take part; weights softmax_j(q_i · k_j / sqrt(hd)).
at::Tensor attention_ref(const at::Tensor& x, remat::encoders::ClipAttention& attn, int64_t heads) {
  const auto q = linear_ref(x, attn->q_proj), k = linear_ref(x, attn->k_proj), v = linear_ref(x, attn->v_proj);
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2), hd = D / heads;
  auto out = at::zeros({B, L, D}, at::kDouble);
  auto qa = q.accessor<double, 3>(), ka = k.accessor<double, 3>(), va = v.accessor<double, 3>();
  auto oa = out.accessor<double, 3>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < hd; ++c) dot += qa[b][i][h * hd + c] * ka[b][j][h * hd + c];
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - m));
        for (int64_t c = 0; c < hd; ++c) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += s[j] / z * va[b][j][h * hd + c];
          oa[b][i][h * hd + c] = acc;
        }
      }
    }
  }
  return linear_ref(out, attn->out_proj);
}

at::Tensor quick_gelu_ref(const at::Tensor& x) { return x / (1.0 + at::exp(-1.702 * x)); }

at::Tensor layer_ref(const at::Tensor& x, remat::encoders::ClipEncoderLayer& layer, const ClipTextConfig& c) {
  const auto xd = x.to(at::kDouble);
  const auto h = xd + attention_ref(layer_norm_ref(xd, layer->layer_norm1->weight, layer->layer_norm1->bias,
                                                   c.layer_norm_eps),
                                    layer->self_attn, c.num_attention_heads);
  const auto n2 = layer_norm_ref(h, layer->layer_norm2->weight, layer->layer_norm2->bias, c.layer_norm_eps);
  const auto f = quick_gelu_ref(linear_ref(n2, layer->mlp->fc1));
  return h + linear_ref(f, layer->mlp->fc2);
}

// Ids of a tokenized tiny caption: bos 730, content, eos 731, pad 731 up to 77.
at::Tensor tiny_ids(const std::vector<std::vector<int64_t>>& contents) {
  auto ids = at::full({static_cast<int64_t>(contents.size()), 77}, 731, at::kLong);
  for (size_t b = 0; b < contents.size(); ++b) {
    ids[b][0] = 730;
    for (size_t i = 0; i < contents[b].size(); ++i) ids[b][i + 1] = contents[b][i];
  }
  return ids;
}

// Both attention paths: the fused kernel where LibTorch has it, the eager formula.
TEST_F(ClipTextModelTest, AttentionIsCausalAndMatchesTheFormula) {
  const auto config = ClipTextConfig::tiny();
  remat::encoders::ClipAttention attn(config);
  randomize(*attn);
  attn->to(at::kDouble);
  const auto x = torch::randn({2, 9, config.hidden_size}, at::kDouble);
  const auto mask = remat::encoders::clip_causal_mask(9, at::kDouble, at::kCPU);
  auto x2 = x.clone();
  x2.index_put_({torch::indexing::Slice(), 5}, torch::randn({2, config.hidden_size}, at::kDouble));
  for (const bool fused : {false, true}) {
    attn->fused_attention = fused;
    const auto got = attn->forward(x, mask);
    EXPECT_LT(max_rel_err(got, attention_ref(x, attn, config.num_attention_heads)), kFp32SoftmaxTolerance)
        << "fused " << fused;
    // Changing a later token leaves earlier outputs alone.
    const auto got2 = attn->forward(x2, mask);
    EXPECT_TRUE(torch::equal(got.narrow(1, 0, 5), got2.narrow(1, 0, 5))) << "fused " << fused;
    EXPECT_FALSE(torch::allclose(got.narrow(1, 5, 1), got2.narrow(1, 5, 1))) << "fused " << fused;
  }
}

// In bfloat16 the eager path (what LibTorch 1.13 runs) rounds as transformers'
// eager_attention_forward orders it: the product times the scale (a Python float), plus the mask,
// softmax in fp32, cast back; the in-place scale and mask give those bits.
TEST_F(ClipTextModelTest, Bfloat16AttentionRoundsAsTheEagerExpression) {
  const auto config = ClipTextConfig::tiny();
  remat::encoders::ClipAttention attn(config);
  randomize(*attn);
  attn->to(at::kBFloat16);
  attn->fused_attention = false;
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 9, config.hidden_size}).to(at::kBFloat16);
  const auto mask = remat::encoders::clip_causal_mask(9, at::kBFloat16, at::kCPU);
  const int64_t B = 2, L = 9, H = config.num_attention_heads, hd = config.hidden_size / H;
  auto heads = [&](const at::Tensor& t) { return t.view({B, L, H, hd}).transpose(1, 2); };
  const auto q = heads(attn->q_proj(x)), k = heads(attn->k_proj(x)), v = heads(attn->v_proj(x));
  const auto scores = at::matmul(q, k.transpose(-1, -2)) * (1.0 / std::sqrt(static_cast<double>(hd))) + mask;
  const auto weights = at::softmax(scores, -1, at::kFloat).to(at::kBFloat16);
  const auto want = attn->out_proj(at::matmul(weights, v).transpose(1, 2).reshape({B, L, config.hidden_size}));
  EXPECT_TRUE(torch::equal(attn->forward(x, mask), want));
}

// The fused kernel keeps the scores in fp32 where the eager formula rounds them to bf16: against
// float64 on the same bf16 weights and input it is at least as close (strictly closer where
// LibTorch has the kernel; on 1.13 both run the formula), and in float32 the paths agree to rounding.
TEST_F(ClipTextModelTest, FusedAttentionIsTheFormulaAndRoundsLessInBfloat16) {
  const auto config = ClipTextConfig::tiny();
  remat::encoders::ClipAttention attn(config);
  {
    torch::NoGradGuard guard;
    for (auto& p : attn->parameters()) p.normal_(0.0, 0.5);  // scores of a few units
  }
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 24, config.hidden_size});
  auto run = [&](bool fused, at::ScalarType dtype) {
    attn->to(dtype);
    attn->fused_attention = fused;
    return attn->forward(x.to(dtype), remat::encoders::clip_causal_mask(24, dtype, at::kCPU)).to(at::kDouble);
  };
  EXPECT_LT(max_rel_err(run(true, at::kFloat), run(false, at::kFloat)), 1e-5);
  const at::Tensor fused = run(true, at::kBFloat16), eager = run(false, at::kBFloat16);
  const at::Tensor exact = attention_ref(x.to(at::kBFloat16), attn, config.num_attention_heads);
  const double fused_error = max_rel_err(fused, exact), eager_error = max_rel_err(eager, exact);
  EXPECT_GT(eager_error, 0.0);
  if (remat::compat::kHasScaledDotProductAttention) {
    EXPECT_LT(fused_error, eager_error);
  } else {
    EXPECT_EQ(fused_error, eager_error);
  }
}

// Without autograd each layer adds its residuals in place, frees its input and runs quick_gelu
// in fc1's output: the same bits as the autograd path, in float32 and bfloat16.
TEST_F(ClipTextModelTest, InferenceInPlaceEqualsTheAutogradPath) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    ClipTextModel model(ClipTextConfig::tiny());
    randomize(*model);
    model->to(dtype);
    const auto ids = tiny_ids({{320, 544, 90}, {12}});
    ASSERT_TRUE(model->text_model->final_layer_norm->weight.requires_grad());
    const auto with_autograd = model->forward(ids);
    torch::NoGradGuard no_grad;
    const auto inference = model->forward(ids);
    EXPECT_TRUE(torch::equal(inference.last_hidden_state, with_autograd.last_hidden_state.detach())) << dtype;
    EXPECT_TRUE(torch::equal(inference.pooled_output, with_autograd.pooled_output.detach())) << dtype;
  }
}

TEST_F(ClipTextModelTest, CausalMaskUsesTheDtypeLowestValue) {
  const auto m = remat::encoders::clip_causal_mask(3, at::kFloat, at::kCPU);
  EXPECT_EQ(m.sizes(), (std::vector<int64_t>{1, 1, 3, 3}));
  EXPECT_EQ(m[0][0][0][0].item<float>(), 0.0f);
  EXPECT_EQ(m[0][0][2][1].item<float>(), 0.0f);
  EXPECT_EQ(m[0][0][0][1].item<float>(), std::numeric_limits<float>::lowest());
  const auto mb = remat::encoders::clip_causal_mask(2, at::kBFloat16, at::kCPU);
  EXPECT_EQ(mb[0][0][0][1].item<float>(), -3.3895313892515355e38f);  // bf16 finfo.min
}

TEST_F(ClipTextModelTest, MlpIsQuickGeluBetweenTwoLinears) {
  const auto config = ClipTextConfig::tiny();
  remat::encoders::ClipMlp mlp(config);
  randomize(*mlp);
  mlp->to(at::kDouble);
  const auto x = torch::randn({3, 5, config.hidden_size}, at::kDouble) * 3.0;
  const auto want = linear_ref(quick_gelu_ref(linear_ref(x, mlp->fc1)), mlp->fc2);
  EXPECT_LT(max_rel_err(mlp->forward(x), want), 1e-12);
}

TEST_F(ClipTextModelTest, GeluActivationIsTheErfGelu) {
  auto config = ClipTextConfig::tiny();
  config.hidden_act = "gelu";
  remat::encoders::ClipMlp mlp(config);
  randomize(*mlp);
  mlp->to(at::kDouble);
  const auto x = torch::randn({2, 4, config.hidden_size}, at::kDouble);
  const auto h = linear_ref(x, mlp->fc1);
  const auto want = linear_ref(0.5 * h * (1.0 + at::erf(h / std::sqrt(2.0))), mlp->fc2);
  EXPECT_LT(max_rel_err(mlp->forward(x), want), 1e-12);
}

TEST_F(ClipTextModelTest, EncoderLayerIsPreNorm) {
  const auto config = ClipTextConfig::tiny();
  remat::encoders::ClipEncoderLayer layer(config);
  randomize(*layer);
  layer->to(at::kDouble);
  const auto x = torch::randn({2, 7, config.hidden_size}, at::kDouble);
  const auto got = layer->forward(x, remat::encoders::clip_causal_mask(7, at::kDouble, at::kCPU));
  EXPECT_LT(max_rel_err(got, layer_ref(x, layer, config)), kFp32SoftmaxTolerance);
}

TEST_F(ClipTextModelTest, WholeTinyModelMatchesAFloat64Composition) {
  const auto config = ClipTextConfig::tiny();
  ClipTextModel model(config);
  randomize(*model);
  const auto ids = tiny_ids({{320, 544, 588}, {5, 6, 7, 8, 9, 10, 11}});

  auto& tm = model->text_model;
  const int64_t L = ids.size(1);
  at::Tensor h = tm->embeddings->token_embedding->weight.to(at::kDouble).index_select(0, ids.flatten()).view({2, L, -1}) +
                 tm->embeddings->position_embedding->weight.to(at::kDouble).narrow(0, 0, L).unsqueeze(0);
  for (const auto& m : *tm->encoder->layers) {
    auto layer = remat::encoders::ClipEncoderLayer(std::dynamic_pointer_cast<remat::encoders::ClipEncoderLayerImpl>(m));
    h = layer_ref(h, layer, config);
  }
  const auto want = layer_norm_ref(h, tm->final_layer_norm->weight, tm->final_layer_norm->bias, config.layer_norm_eps);
  // Pooled: first eos (731) of each row: positions 4 and 8.
  const auto want_pooled = at::stack({want[0][4], want[1][8]});

  const auto out = model->forward(ids);
  EXPECT_EQ(out.last_hidden_state.scalar_type(), at::kFloat);
  EXPECT_LT(max_rel_err(out.last_hidden_state, want), 1e-5);
  EXPECT_LT(max_rel_err(out.pooled_output, want_pooled), 1e-5);

  model->to(at::kDouble);
  const auto out64 = model->forward(ids);
  EXPECT_LT(max_rel_err(out64.last_hidden_state, want), kFp32SoftmaxTolerance);
  EXPECT_LT(max_rel_err(out64.pooled_output, want_pooled), kFp32SoftmaxTolerance);

  // bf16 runs in bf16 and stays close.
  model->to(at::kBFloat16);
  const auto out16 = model->forward(ids);
  EXPECT_EQ(out16.last_hidden_state.scalar_type(), at::kBFloat16);
  EXPECT_EQ(out16.pooled_output.sizes(), (std::vector<int64_t>{2, config.hidden_size}));
  EXPECT_LT(max_rel_err(out16.last_hidden_state, want), 5e-2);
}

TEST_F(ClipTextModelTest, PooledRuleLegacyBranchTakesTheFirstLargestId) {
  // Every row's largest id is 49407: argmax of the ids, the first maximum (FLUX.1: config eos 2).
  const auto ids = torch::tensor({49406, 320, 49407, 49407, 49407, 49406, 2, 5, 6, 49407}, at::kLong).view({2, 5});
  const auto pos = remat::encoders::clip_pooled_positions(ids, /*eos_token_id=*/2);
  EXPECT_EQ(pos[0].item<int64_t>(), 2);
  EXPECT_EQ(pos[1].item<int64_t>(), 4);  // the eos-id rule would have picked 1 (the id 2)
  // The config decides, not the ids: with eos 2 a row without 49407 still takes its largest id.
  const auto plain = torch::tensor({7, 2, 900, 900, 3}, at::kLong).view({1, 5});
  EXPECT_EQ(remat::encoders::clip_pooled_positions(plain, 2)[0].item<int64_t>(), 2);
}

TEST_F(ClipTextModelTest, PooledRuleEosBranchTakesTheFirstEosId) {
  // A config eos other than 2: the eos-id rule for every row, first occurrence, 0 when absent.
  const auto ids = torch::tensor({730, 12, 731, 731, 900, 730, 5, 6, 7, 8, 49407, 731, 2, 731, 3}, at::kLong).view({3, 5});
  const auto pos = remat::encoders::clip_pooled_positions(ids, /*eos_token_id=*/731);
  EXPECT_EQ(pos[0].item<int64_t>(), 2);  // the legacy argmax would be 4 (id 900)
  EXPECT_EQ(pos[1].item<int64_t>(), 0);  // no 731 in the row
  EXPECT_EQ(pos[2].item<int64_t>(), 1);  // not the 49407 at 0
}

TEST_F(ClipTextModelTest, KeysAreTransformersKeys) {
  ClipTextModel model(ClipTextConfig::tiny());
  std::set<std::string> got;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : remat::io::module_state(*model)) {
    got.insert(name);
    shapes[name] = t.sizes().vec();
  }
  std::set<std::string> want = {"text_model.embeddings.token_embedding.weight",
                                "text_model.embeddings.position_embedding.weight",
                                "text_model.final_layer_norm.weight", "text_model.final_layer_norm.bias"};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "text_model.encoder.layers." + std::to_string(l) + ".";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      want.insert(p + "self_attn." + proj + ".weight");
      want.insert(p + "self_attn." + proj + ".bias");
    }
    for (const char* n : {"layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2"}) {
      want.insert(p + n + ".weight");
      want.insert(p + n + ".bias");
    }
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(got.size(), 36u);
  EXPECT_EQ(shapes["text_model.embeddings.token_embedding.weight"], (std::vector<int64_t>{732, 32}));
  EXPECT_EQ(shapes["text_model.embeddings.position_embedding.weight"], (std::vector<int64_t>{77, 32}));
  EXPECT_EQ(shapes["text_model.encoder.layers.1.mlp.fc1.weight"], (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(shapes["text_model.encoder.layers.1.mlp.fc2.weight"], (std::vector<int64_t>{32, 64}));
}

TEST_F(ClipTextModelTest, ParameterCounts) {
  // 123,060,480: the text tower of openai/clip-vit-large-patch14 (427,616,513 in all for CLIP
  // ViT-L/14 = 303,179,776 vision (24 layers of width 1024, 257 positions) + 123,060,480 text + 768·768 text and 1024·768 vision projections
  // + logit_scale), as model.num_parameters() reports it.
  EXPECT_EQ(remat::encoders::parameter_count(ClipTextConfig::clip_l()), 123060480);
  EXPECT_EQ(427616513 - 303179776 - 768 * 768 - 1024 * 768 - 1, 123060480);
  ClipTextModel model(ClipTextConfig::tiny());
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  EXPECT_EQ(remat::encoders::parameter_count(ClipTextConfig::tiny()), n);
  EXPECT_EQ(n, 43040);
}

TEST_F(ClipTextModelTest, ConfigRoundTripsThroughJson) {
  for (const auto& config : {ClipTextConfig::clip_l(), ClipTextConfig::tiny()}) {
    const std::string text = config.to_json();
    EXPECT_NE(text.find("\"architectures\": [\n    \"CLIPTextModel\"\n  ]"), std::string::npos) << text;
    EXPECT_NE(text.find("\"model_type\": \"clip_text_model\""), std::string::npos);
    EXPECT_TRUE(ClipTextConfig::from_json_text(text, "round trip") == config);
  }
  // FLUX.1's text_encoder/config.json as transformers writes it (the fields that matter).
  const auto flux = ClipTextConfig::from_json_text(
      R"({"architectures": ["CLIPTextModel"], "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "quick_gelu",
          "hidden_size": 768, "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 77,
          "model_type": "clip_text_model", "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
          "projection_dim": 768, "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "vocab_size": 49408})",
      "flux");
  EXPECT_TRUE(flux == ClipTextConfig::clip_l());
}

// to_json's bytes, as transformers' CLIPTextConfig.to_json_string writes them (sorted keys).
TEST_F(ClipTextModelTest, ConfigToJsonTextIsStable) {
  EXPECT_EQ(ClipTextConfig::tiny().to_json(), R"({
  "architectures": [
    "CLIPTextModel"
  ],
  "attention_dropout": 0.0,
  "bos_token_id": 730,
  "dropout": 0.0,
  "eos_token_id": 731,
  "hidden_act": "quick_gelu",
  "hidden_size": 32,
  "initializer_factor": 1.0,
  "initializer_range": 0.02,
  "intermediate_size": 64,
  "layer_norm_eps": 1e-05,
  "max_position_embeddings": 77,
  "model_type": "clip_text_model",
  "num_attention_heads": 2,
  "num_hidden_layers": 2,
  "pad_token_id": 731,
  "projection_dim": 32,
  "vocab_size": 732
}
)");
}

// A config with every field away from clip_l() comes back equal, and == sees each field.
TEST_F(ClipTextModelTest, ConfigEveryFieldRoundTripsAndCounts) {
  ClipTextConfig c;
  c.vocab_size = 100;
  c.hidden_size = 48;
  c.intermediate_size = 96;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.max_position_embeddings = 16;
  c.hidden_act = "gelu";
  c.layer_norm_eps = 1e-6;
  c.bos_token_id = 97;
  c.eos_token_id = 98;
  c.pad_token_id = 99;
  c.projection_dim = 24;
  EXPECT_TRUE(ClipTextConfig::from_json_text(c.to_json(), "round trip") == c);
  const std::vector<void (*)(ClipTextConfig&)> changes = {
      [](ClipTextConfig& x) { x.vocab_size += 1; },
      [](ClipTextConfig& x) { x.hidden_size += 1; },
      [](ClipTextConfig& x) { x.intermediate_size += 1; },
      [](ClipTextConfig& x) { x.num_hidden_layers += 1; },
      [](ClipTextConfig& x) { x.num_attention_heads += 1; },
      [](ClipTextConfig& x) { x.max_position_embeddings += 1; },
      [](ClipTextConfig& x) { x.hidden_act = "quick_gelu"; },
      [](ClipTextConfig& x) { x.layer_norm_eps *= 2; },
      [](ClipTextConfig& x) { x.bos_token_id += 1; },
      [](ClipTextConfig& x) { x.eos_token_id += 1; },
      [](ClipTextConfig& x) { x.pad_token_id += 1; },
      [](ClipTextConfig& x) { x.projection_dim += 1; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    ClipTextConfig other = c;
    changes[i](other);
    EXPECT_FALSE(other == c) << "change " << i;
  }
}

TEST_F(ClipTextModelTest, ConfigWrongTypesNameTheKey) {
  using remat::testing::error_of;
  EXPECT_EQ(error_of([] { ClipTextConfig::from_json_text(R"({"hidden_act": 1})", "'c.json'"); }),
            "[clip] 'c.json': config key 'hidden_act' must be a string, got 1\n");
  EXPECT_EQ(error_of([] { ClipTextConfig::from_json_text(R"({"layer_norm_eps": "1e-5"})", "'c.json'"); }),
            "[clip] 'c.json': config key 'layer_norm_eps' must be a number, got \"1e-5\"\n");
  EXPECT_EQ(error_of([] { ClipTextConfig::from_json_text(R"({"eos_token_id": 2.0})", "'c.json'"); }),
            "[clip] 'c.json': config key 'eos_token_id' must be an integer (64-bit), got 2.0\n");
}

TEST_F(ClipTextModelTest, ConfigErrorsNameTheFileAndTheValue) {
  using remat::testing::error_of;
  EXPECT_EQ(error_of([] { ClipTextConfig::from_json_text(R"({"hidden_act": "relu"})", "'te/config.json'"); }),
            "[clip] 'te/config.json': hidden_act must be one of quick_gelu, gelu, got 'relu'\n");
  EXPECT_EQ(error_of([] { ClipTextConfig::from_json_text(R"({"hidden_size": "768"})", "'c.json'"); }),
            "[clip] 'c.json': config key 'hidden_size' must be an integer (64-bit), got \"768\"\n");
  EXPECT_EQ(error_of([] { ClipTextConfig::from_json_text(R"({"hidden_size": 100})", "'c.json'"); }),
            "[clip] 'c.json': hidden_size must be divisible by num_attention_heads, got 100 and 12\n");
  EXPECT_NE(error_of([] { ClipTextConfig::from_json_text("{", "'c.json'"); }).find("[clip] 'c.json': malformed config JSON"),
            std::string::npos);
  EXPECT_NE(error_of([] { ClipTextConfig::from_file("/nonexistent/config.json"); }).find("/nonexistent/config.json"),
            std::string::npos);
}

class ClipTextLoadTest : public ClipTextModelTest {
 protected:
  std::string path(const char* name) const { return dir_ / name; }
  remat::testing::TempDir dir_{"remat_clip_load"};
};

TEST_F(ClipTextLoadTest, LoadsStrictlyInFp32AndBf16AndIgnoresPositionIds) {
  const auto config = ClipTextConfig::tiny();
  ClipTextModel source(config);
  randomize(*source);
  auto entries = remat::io::module_state(*source);
  entries.emplace_back("text_model.embeddings.position_ids", at::arange(77, at::kLong).view({1, 77}));
  remat::io::save_safetensors(path("model.safetensors"), entries);

  const auto ids = tiny_ids({{320, 544}});
  const auto want = source->forward(ids);
  auto fp32 = remat::encoders::load_clip_text_model(path("model.safetensors"), config, at::kFloat);
  EXPECT_TRUE(torch::equal(fp32->forward(ids).last_hidden_state, want.last_hidden_state));
  auto bf16 = remat::encoders::load_clip_text_model(path("model.safetensors"), config, at::kBFloat16);
  EXPECT_EQ(bf16->text_model->final_layer_norm->weight.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(torch::equal(bf16->text_model->final_layer_norm->weight,
                           source->text_model->final_layer_norm->weight.to(at::kBFloat16)));
}

// transformers 5 saves CLIPTextModel without the `text_model.` prefix (its CLIPTextModel holds the
// embeddings, encoder and final norm itself); such a file loads to the same model.
TEST_F(ClipTextLoadTest, LoadsTransformers5KeysWithoutTheTextModelPrefix) {
  const auto config = ClipTextConfig::tiny();
  ClipTextModel source(config);
  randomize(*source);
  std::vector<remat::io::NamedTensor> entries;
  for (auto& [key, tensor] : remat::io::module_state(*source)) {
    ASSERT_EQ(key.rfind("text_model.", 0), 0u) << key;
    entries.emplace_back(key.substr(std::string("text_model.").size()), tensor);
  }
  entries.emplace_back("embeddings.position_ids", at::arange(77, at::kLong).view({1, 77}));
  remat::io::save_safetensors(path("model.safetensors"), entries);

  const auto ids = tiny_ids({{320, 544}});
  auto loaded = remat::encoders::load_clip_text_model(path("model.safetensors"), config, at::kFloat);
  EXPECT_TRUE(torch::equal(loaded->forward(ids).last_hidden_state, source->forward(ids).last_hidden_state));

  // A file missing a key is still refused, and names the key as the model knows it.
  const std::string dropped = "text_model." + entries.front().first;
  entries.erase(entries.begin());
  remat::io::save_safetensors(path("short.safetensors"), entries);
  const std::string msg = remat::testing::error_of(
      [&] { remat::encoders::load_clip_text_model(path("short.safetensors"), config, at::kFloat); });
  EXPECT_NE(msg.find("missing key (in the module, not in the file): " + dropped), std::string::npos) << msg;
}

TEST_F(ClipTextLoadTest, KeyMismatchNamesTheFileAndTheKey) {
  const auto config = ClipTextConfig::tiny();
  ClipTextModel source(config);
  std::vector<remat::io::NamedTensor> entries;
  for (auto& e : remat::io::module_state(*source)) {
    if (e.first != "text_model.encoder.layers.1.mlp.fc2.bias") entries.push_back(e);
  }
  entries.emplace_back("text_model.text_projection.weight", at::zeros({32, 32}));
  remat::io::save_safetensors(path("bad.safetensors"), entries);
  const std::string msg = remat::testing::error_of(
      [&] { remat::encoders::load_clip_text_model(path("bad.safetensors"), config, at::kFloat); });
  EXPECT_EQ(msg.rfind("[clip] '" + path("bad.safetensors") + "' does not match CLIPTextModel", 0), 0u) << msg;
  EXPECT_NE(msg.find("text_model.encoder.layers.1.mlp.fc2.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("text_model.text_projection.weight"), std::string::npos) << msg;

  // A wrong shape (a CLIP-L file for the tiny config) is named as well.
  auto wrong = remat::io::module_state(*source);
  wrong[0].second = at::zeros({wrong[0].second.size(0) + 1, wrong[0].second.size(1)});
  remat::io::save_safetensors(path("shape.safetensors"), wrong);
  const std::string shape_msg = remat::testing::error_of(
      [&] { remat::encoders::load_clip_text_model(path("shape.safetensors"), config, at::kFloat); });
  EXPECT_NE(shape_msg.find(wrong[0].first), std::string::npos) << shape_msg;
}

TEST_F(ClipTextModelTest, RejectsBadInputIds) {
  ClipTextModel model(ClipTextConfig::tiny());
  using remat::testing::error_of;
  EXPECT_NE(error_of([&] { model->forward(at::full({1, 78}, 5, at::kLong)); }).find("max_position_embeddings (77)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model->forward(at::full({1, 4}, 732, at::kLong)); }).find("[0, 732)"), std::string::npos);
  EXPECT_NE(error_of([&] { model->forward(at::full({1, 4}, 5, at::kInt)); }).find("int64"), std::string::npos);
}

}  // namespace clip_text_model_test
}  // namespace
