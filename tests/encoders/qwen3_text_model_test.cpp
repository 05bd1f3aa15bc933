// Qwen3-VL's language model against a float64 computation written here from the published formulas
// (per head, per position, with explicit loops where the module uses broadcasting): RMSNorm, the
// per-head q/k norms, RoPE on the two halves of each head with theta^(-2i/d), causal softmax
// attention with grouped key/value heads, SwiGLU. Also its config.json (Qwen3-VL's nested
// text_config, transformers 5's rope_parameters), its checkpoint keys (the vision tower and
// lm_head ignored) and its errors. The module was compared once with transformers' own
// Qwen3VLTextModel (docs/MAGEFLOW.md).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "remat/encoders/qwen3_text_model.h"
#include "remat/io/safetensors.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::encoders {
namespace {
namespace qwen3_text_model_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;

Qwen3TextConfig tiny() {
  Qwen3TextConfig c;
  c.vocab_size = 50;
  c.hidden_size = 24;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 5e6;
  return c;
}

// Every parameter random, norm weights too (ones would hide a missing multiplication).
void randomise(torch::nn::Module& m, uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(torch::randn(p.sizes(), p.options()) * 0.5);
}

// ---- the float64 reference ----
at::Tensor rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  return w * x / at::sqrt((x * x).mean(-1, true) + eps);
}

at::Tensor reference(torch::nn::Module& module, const Qwen3TextConfig& c, const std::vector<int64_t>& ids) {
  const auto params = module.named_parameters();
  const auto P = [&](const std::string& name) { return params[name].to(at::kDouble); };
  const int64_t L = static_cast<int64_t>(ids.size()), d = c.head_dim, H = c.num_attention_heads;
  const int64_t group = H / c.num_key_value_heads;
  at::Tensor h = at::zeros({L, c.hidden_size}, at::kDouble);
  for (int64_t t = 0; t < L; ++t) h[t] = P("embed_tokens.weight")[ids[t]];
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    const at::Tensor x = rms(h, P(p + "input_layernorm.weight"), c.rms_norm_eps);
    const at::Tensor q = at::matmul(x, P(p + "self_attn.q_proj.weight").t());
    const at::Tensor k = at::matmul(x, P(p + "self_attn.k_proj.weight").t());
    const at::Tensor v = at::matmul(x, P(p + "self_attn.v_proj.weight").t());
    at::Tensor attended = at::zeros({L, H * d}, at::kDouble);
    // Rotation of the two halves (j, j + d/2) of a head by position * theta^(-2j/d).
    const auto rope = [&](at::Tensor head, int64_t pos) {
      at::Tensor out = head.clone();
      for (int64_t j = 0; j < d / 2; ++j) {
        const double angle = static_cast<double>(pos) * std::pow(c.rope_theta, -2.0 * static_cast<double>(j) / d);
        const double a = head[j].item<double>(), b = head[j + d / 2].item<double>();
        out[j] = a * std::cos(angle) - b * std::sin(angle);
        out[j + d / 2] = b * std::cos(angle) + a * std::sin(angle);
      }
      return out;
    };
    for (int64_t head = 0; head < H; ++head) {
      const int64_t kv = head / group;
      std::vector<at::Tensor> keys, values;
      for (int64_t s = 0; s < L; ++s) {
        keys.push_back(rope(rms(k[s].narrow(0, kv * d, d), P(p + "self_attn.k_norm.weight"), c.rms_norm_eps), s));
        values.push_back(v[s].narrow(0, kv * d, d));
      }
      for (int64_t t = 0; t < L; ++t) {
        const at::Tensor qt = rope(rms(q[t].narrow(0, head * d, d), P(p + "self_attn.q_norm.weight"), c.rms_norm_eps), t);
        std::vector<double> scores;
        for (int64_t s = 0; s <= t; ++s) scores.push_back((qt * keys[s]).sum().item<double>() / std::sqrt(double(d)));
        double top = scores[0];
        for (double sc : scores) top = std::max(top, sc);
        double total = 0;
        for (double& sc : scores) total += (sc = std::exp(sc - top));
        at::Tensor out = at::zeros({d}, at::kDouble);
        for (int64_t s = 0; s <= t; ++s) out += values[s] * (scores[s] / total);
        attended[t].narrow(0, head * d, d).copy_(out);
      }
    }
    h = h + at::matmul(attended, P(p + "self_attn.o_proj.weight").t());
    const at::Tensor y = rms(h, P(p + "post_attention_layernorm.weight"), c.rms_norm_eps);
    const at::Tensor gate = at::matmul(y, P(p + "mlp.gate_proj.weight").t());
    const at::Tensor up = at::matmul(y, P(p + "mlp.up_proj.weight").t());
    h = h + at::matmul(gate / (1 + at::exp(-gate)) * up, P(p + "mlp.down_proj.weight").t());
  }
  return rms(h, P("norm.weight"), c.rms_norm_eps);
}

TEST(Qwen3TextModel, EqualsTheFloat64Formulas) {
  const std::vector<int64_t> ids = {3, 17, 49, 0, 8, 8, 21};
  for (const auto dtype : {at::kDouble, at::kFloat}) {
    Qwen3TextModel model(tiny());
    model->to(dtype);
    randomise(*model, 4);
    const at::Tensor expected = reference(*model, tiny(), ids);
    torch::NoGradGuard no_grad;
    const at::Tensor got = model->forward(torch::tensor(ids, at::kLong).unsqueeze(0)).squeeze(0);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{7, 24}));
    // float64: the RoPE angles are float32, as upstream computes them (inv_freq and positions).
    const double tol = dtype == at::kDouble ? 1e-6 : 1e-4;
    EXPECT_TRUE(at::allclose(got.to(at::kDouble), expected, tol, tol))
        << c10::toString(dtype) << " max diff " << (got.to(at::kDouble) - expected).abs().max().item<double>();
  }
}

TEST(Qwen3TextModel, AttentionIsCausalAndBatchesAreIndependent) {
  Qwen3TextModel model(tiny());
  model->to(at::kDouble);
  randomise(*model, 5);
  torch::NoGradGuard no_grad;
  const at::Tensor a = torch::tensor(std::vector<int64_t>{1, 2, 3, 4, 5}, at::kLong);
  const at::Tensor b = torch::tensor(std::vector<int64_t>{1, 2, 3, 9, 9}, at::kLong);
  const at::Tensor both = model->forward(at::stack({a, b}));
  // The first three positions see the same prefix.
  EXPECT_TRUE(at::allclose(both[0].narrow(0, 0, 3), both[1].narrow(0, 0, 3), 1e-12, 1e-12));
  EXPECT_FALSE(at::allclose(both[0].narrow(0, 3, 2), both[1].narrow(0, 3, 2)));
  EXPECT_TRUE(at::allclose(both[0], model->forward(a.unsqueeze(0))[0], 1e-12, 1e-12));
}

TEST(Qwen3TextModel, Bf16FollowsFloat32) {
  Qwen3TextModel model(tiny());
  randomise(*model, 6);
  torch::NoGradGuard no_grad;
  const at::Tensor ids = torch::tensor(std::vector<int64_t>{4, 5, 6, 7, 8, 9}, at::kLong).unsqueeze(0);
  const at::Tensor f32 = model->forward(ids);
  model->to(at::kBFloat16);
  const at::Tensor bf16 = model->forward(ids);
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
  // Two layers of bfloat16 rounding: a few per cent of the activations' scale.
  EXPECT_LT((bf16.to(at::kFloat) - f32).abs().max().item<float>(), 0.1 * f32.abs().max().item<float>());
}

TEST(Qwen3TextConfigTest, ReadsQwen3VlsNestedTextConfig) {
  const auto c = Qwen3TextConfig::from_json_text(R"({
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
    "vision_config": {"depth": 24, "hidden_size": 1024},
    "text_config": {"vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
      "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
      "rms_norm_eps": 1e-06, "hidden_act": "silu", "attention_bias": false,
      "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"},
      "rope_theta": 5000000}
  })");
  EXPECT_EQ(c.num_hidden_layers, 36);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rope_theta, 5e6);
  // Qwen3-VL-4B's language model, counted by hand: embeddings 151936 x 2560 = 388,956,160; per
  // layer q 2560 x 4096, k and v 2560 x 1024 each, o 4096 x 2560, q/k norms 2 x 128, MLP 3 x 2560 x
  // 9728, two norms 2 x 2560 = 100,930,816, times 36; the final norm 2560.
  EXPECT_EQ(c.parameter_count(), 4'022'468'096LL);
  // transformers 5 writes rope_parameters; a plain Qwen3 config has the fields at the top level.
  const auto v5 = Qwen3TextConfig::from_json_text(
      R"({"text_config": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "rope_parameters": {"rope_theta": 1000.0, "rope_type": "default"}}})");
  EXPECT_EQ(v5.rope_theta, 1000.0);
  EXPECT_EQ(v5.head_dim, 128);  // Qwen3VLTextConfig's default, not hidden_size / heads
  const auto plain = Qwen3TextConfig::from_json_text(
      R"({"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16})");
  EXPECT_EQ(plain.hidden_size, 64);
  EXPECT_EQ(plain.head_dim, 16);
}

TEST(Qwen3TextConfigTest, ErrorsNameTheKeyAndWhatIsSupported) {
  remat::testing::TempDir dir;
  const std::string path = dir / "config.json";
  std::ofstream(path) << R"({"text_config": {"hidden_act": "gelu"}})";
  EXPECT_NE(error_of([&] { Qwen3TextConfig::from_json_file(path); })
                .find("[qwen3] '" + path + "': hidden_act 'gelu' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([] { Qwen3TextConfig::from_json_text(R"({"num_attention_heads": 6, "num_key_value_heads": 4})"); })
                .find("num_key_value_heads (4) must divide num_attention_heads (6)"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              Qwen3TextConfig::from_json_text(R"({"rope_scaling": {"rope_type": "yarn", "factor": 4}})");
            }).find("rope_type 'yarn' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([] { Qwen3TextConfig::from_json_text(R"({"num_hidden_layers": "36"})"); })
                .find("config key 'num_hidden_layers' must be an integer"),
            std::string::npos);
  Qwen3TextModel model(tiny());
  EXPECT_NE(error_of([&] { model->forward(torch::tensor(std::vector<int64_t>{1, 50}, at::kLong).unsqueeze(0)); })
                .find("token ids must be in [0, 50), got 50"),
            std::string::npos);
}

// A Qwen3-VL checkpoint: the language model under model.language_model., the vision tower and
// lm_head beside it; loaded straight into bfloat16, the vision keys ignored, a missing key named.
TEST(Qwen3TextModel, LoadsTheLanguageModelOfAQwen3VlCheckpoint) {
  remat::testing::TempDir dir;
  Qwen3TextModel source(tiny());
  randomise(*source, 7);
  std::vector<io::NamedTensor> tensors;
  for (const auto& item : source->named_parameters()) {
    tensors.push_back({std::string(kQwen3VlLanguageModelPrefix) + item.key(), item.value()});
  }
  tensors.push_back({"model.visual.patch_embed.proj.weight", torch::randn({4, 3})});
  tensors.push_back({"lm_head.weight", torch::randn({50, 24})});
  const std::string path = dir / "model.safetensors";
  io::save_safetensors(path, tensors);
  std::vector<io::SafetensorsFile> files;
  files.push_back(io::SafetensorsFile::open(path));
  const Qwen3TextModel loaded = load_qwen3_text_model(files, tiny(), at::kBFloat16);
  for (const auto& item : loaded->named_parameters()) {
    EXPECT_EQ(item.value().scalar_type(), at::kBFloat16) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), source->named_parameters()[item.key()].to(at::kBFloat16))) << item.key();
  }
  // One key short: named, with its prefix.
  tensors.erase(tensors.begin());
  io::save_safetensors(path, tensors);
  std::vector<io::SafetensorsFile> short_files;
  short_files.push_back(io::SafetensorsFile::open(path));
  try {
    load_qwen3_text_model(short_files, tiny(), at::kFloat);
    ADD_FAILURE() << "a missing key must be an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("missing key (in the module, not in the file): embed_tokens.weight"),
              std::string::npos) << e.what_without_backtrace();
  }
}

}  // namespace qwen3_text_model_test
}  // namespace
}  // namespace remat::encoders
