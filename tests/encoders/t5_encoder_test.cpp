#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "remat/encoders/t5_encoder.h"
#include "remat/io/safetensors.h"
#include "temp_dir.h"
#include "value_error.h"

// Every module of the T5 encoder against double-precision loops written here from the published
// formulas (T5 paper; transformers' modeling_t5.py as described in docs/T5.md), never against
// outputs of the code under test.

namespace {
namespace t5_encoder_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::encoders::T5Config;
using remat::encoders::T5EncoderModel;
using remat::testing::error_text;
using remat::testing::error_of;
using Matrix = std::vector<std::vector<double>>;  // row-major (rows, cols)

// ---- references ----------------------------------------------------------------------------

// The bidirectional bucket with exact integer arithmetic: 8 + floor(2 log2(n / 8)) is the largest
// 8 + k with 64 * 2^k <= n^2, capped at 15 (T5: 32 buckets, max distance 128).
int64_t bucket_reference(int64_t rel) {
  int64_t bucket = rel > 0 ? 16 : 0;
  const int64_t n = std::abs(rel);
  if (n < 8) return bucket + n;
  int64_t k = 0;
  while (64 * (int64_t{1} << (k + 1)) <= n * n && k < 7) ++k;
  return bucket + std::min<int64_t>(15, 8 + k);
}

Matrix to_matrix(const at::Tensor& t) {
  const auto c = t.to(at::kDouble).contiguous();
  Matrix m(c.size(0), std::vector<double>(c.size(1)));
  auto a = c.accessor<double, 2>();
  for (size_t i = 0; i < m.size(); ++i)
    for (size_t j = 0; j < m[i].size(); ++j) m[i][j] = a[i][j];
  return m;
}

// y = x W^T for x (L, in), W (out, in).
Matrix linear(const Matrix& x, const Matrix& w) {
  Matrix y(x.size(), std::vector<double>(w.size(), 0.0));
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t o = 0; o < w.size(); ++o)
      for (size_t k = 0; k < w[o].size(); ++k) y[i][o] += x[i][k] * w[o][k];
  return y;
}

Matrix rms_norm(const Matrix& x, const std::vector<double>& w, double eps) {
  Matrix y = x;
  for (size_t i = 0; i < x.size(); ++i) {
    double ms = 0.0;
    for (double v : x[i]) ms += v * v;
    ms /= static_cast<double>(x[i].size());
    for (size_t j = 0; j < x[i].size(); ++j) y[i][j] = w[j] * x[i][j] / std::sqrt(ms + eps);
  }
  return y;
}

double gelu_tanh(double x) {
  const double pi = std::acos(-1.0);
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}

// softmax_j(q_i . k_j + bias[h][i][j]) with masked keys excluded; no 1/sqrt(d) scaling.
Matrix attention(const Matrix& x, const Matrix& wq, const Matrix& wk, const Matrix& wv,
                 const Matrix& wo, int64_t heads, int64_t dk,
                 const std::vector<Matrix>& bias, const std::vector<int>& mask) {
  const Matrix q = linear(x, wq), k = linear(x, wk), v = linear(x, wv);
  const size_t L = x.size();
  Matrix out(L, std::vector<double>(heads * dk, 0.0));
  for (int64_t h = 0; h < heads; ++h) {
    for (size_t i = 0; i < L; ++i) {
      std::vector<double> s(L, -INFINITY);
      double max = -INFINITY;
      for (size_t j = 0; j < L; ++j) {
        if (!mask[j]) continue;
        double dot = 0.0;
        for (int64_t d = 0; d < dk; ++d) dot += q[i][h * dk + d] * k[j][h * dk + d];
        s[j] = dot + bias[h][i][j];
        max = std::max(max, s[j]);
      }
      double z = 0.0;
      for (size_t j = 0; j < L; ++j) z += mask[j] ? std::exp(s[j] - max) : 0.0;
      for (size_t j = 0; j < L; ++j) {
        if (!mask[j]) continue;
        const double p = std::exp(s[j] - max) / z;
        for (int64_t d = 0; d < dk; ++d) out[i][h * dk + d] += p * v[j][h * dk + d];
      }
    }
  }
  return linear(out, wo);
}

Matrix gated_gelu_ff(const Matrix& x, const Matrix& wi0, const Matrix& wi1, const Matrix& wo) {
  Matrix a = linear(x, wi0);
  const Matrix b = linear(x, wi1);
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) a[i][j] = gelu_tanh(a[i][j]) * b[i][j];
  return linear(a, wo);
}

void add(Matrix& a, const Matrix& b) {
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) a[i][j] += b[i][j];
}

std::vector<double> to_vector(const at::Tensor& t) {
  const auto c = t.to(at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// The T5 bias per head (H x L x L) from the table (buckets, H).
std::vector<Matrix> position_bias(const Matrix& table, int64_t heads, size_t L) {
  std::vector<Matrix> bias(heads, Matrix(L, std::vector<double>(L)));
  for (int64_t h = 0; h < heads; ++h)
    for (size_t i = 0; i < L; ++i)
      for (size_t j = 0; j < L; ++j)
        bias[h][i][j] = table[bucket_reference(static_cast<int64_t>(j) - static_cast<int64_t>(i))][h];
  return bias;
}

// ---- fixtures --------------------------------------------------------------------------------

class T5EncoderTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(1234); }

  // A tiny model with random weights large enough that every term matters.
  static T5EncoderModel random_tiny(at::ScalarType dtype = at::kDouble) {
    T5EncoderModel model(T5Config::tiny());
    torch::NoGradGuard guard;
    for (auto& p : model->parameters()) p.normal_(0.0, 0.3);
    for (auto& item : model->named_parameters()) {
      if (item.key().find("layer_norm") != std::string::npos) item.value().uniform_(0.5, 1.5);
    }
    model->to(dtype);
    model->eval();
    return model;
  }

  static at::Tensor param(T5EncoderModel& model, const std::string& key) {
    return model->named_parameters()[key];
  }

  // The whole encoder for one sequence, composed from the references above.
  static Matrix reference_forward(T5EncoderModel& model, const std::vector<int64_t>& ids,
                                  const std::vector<int>& mask) {
    const T5Config& c = model->config();
    const Matrix embedding = to_matrix(param(model, "shared.weight"));
    Matrix h;
    for (int64_t id : ids) h.push_back(embedding[id]);  // no sqrt(D) scaling
    const auto bias = position_bias(
        to_matrix(param(model, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")),
        c.num_heads, ids.size());
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "encoder.block." + std::to_string(l) + ".layer.";
      const Matrix a = rms_norm(h, to_vector(param(model, p + "0.layer_norm.weight")), c.layer_norm_epsilon);
      add(h, attention(a, to_matrix(param(model, p + "0.SelfAttention.q.weight")),
                       to_matrix(param(model, p + "0.SelfAttention.k.weight")),
                       to_matrix(param(model, p + "0.SelfAttention.v.weight")),
                       to_matrix(param(model, p + "0.SelfAttention.o.weight")), c.num_heads, c.d_kv,
                       bias, mask));
      const Matrix f = rms_norm(h, to_vector(param(model, p + "1.layer_norm.weight")), c.layer_norm_epsilon);
      add(h, gated_gelu_ff(f, to_matrix(param(model, p + "1.DenseReluDense.wi_0.weight")),
                           to_matrix(param(model, p + "1.DenseReluDense.wi_1.weight")),
                           to_matrix(param(model, p + "1.DenseReluDense.wo.weight"))));
    }
    return rms_norm(h, to_vector(param(model, "encoder.final_layer_norm.weight")), c.layer_norm_epsilon);
  }

  static double max_abs_diff(const at::Tensor& out, const Matrix& ref) {
    const Matrix o = to_matrix(out);
    double m = 0.0;
    for (size_t i = 0; i < o.size(); ++i)
      for (size_t j = 0; j < o[i].size(); ++j) m = std::max(m, std::abs(o[i][j] - ref[i][j]));
    return m;
  }

  // Files of one test, in a directory of its own process (ctest runs tests side by side).
  std::string temp(const std::string& name) const { return dir_ / name; }
  remat::testing::TempDir dir_{"t5_encoder_test"};
};

// ---- relative position buckets ---------------------------------------------------------------

TEST_F(T5EncoderTest, RelativePositionBucketMatchesTheFormula) {
  const auto rel = torch::arange(-700, 701, torch::kLong);
  const auto got = remat::encoders::relative_position_bucket(rel, true, 32, 128);
  for (int64_t i = 0; i < rel.numel(); ++i) {
    const int64_t r = rel[i].item<int64_t>();
    ASSERT_EQ(got[i].item<int64_t>(), bucket_reference(r)) << "relative position " << r;
  }
}

TEST_F(T5EncoderTest, RelativePositionBucketHandValues) {
  // Worked by hand from the table in docs/T5.md (memory position minus query position).
  const std::vector<std::pair<int64_t, int64_t>> cases = {
      {0, 0},   {-1, 1},   {-7, 7},   {-8, 8},   {-11, 8},  {-12, 9},  {-16, 10}, {-22, 10},
      {-23, 11}, {-32, 12}, {-45, 12}, {-46, 13}, {-64, 14}, {-90, 14}, {-91, 15}, {-511, 15},
      {1, 17},  {7, 23},   {8, 24},   {16, 26},  {31, 27},  {32, 28},  {64, 30},  {91, 31},
      {128, 31}, {100000, 31}};
  for (const auto& [rel, bucket] : cases) {
    const auto got = remat::encoders::relative_position_bucket(torch::tensor({rel}), true, 32, 128);
    EXPECT_EQ(got.item<int64_t>(), bucket) << "relative position " << rel;
  }
  // Unidirectional (decoder) form: only past positions, 16 exact then log-spaced up to 31.
  const auto uni = remat::encoders::relative_position_bucket(
      torch::tensor({5, 0, -5, -15, -16, -1000}, torch::kLong), false, 32, 128);
  EXPECT_EQ(std::vector<int64_t>(uni.data_ptr<int64_t>(), uni.data_ptr<int64_t>() + 6),
            (std::vector<int64_t>{0, 0, 5, 15, 16, 31}));
}

// ---- modules ---------------------------------------------------------------------------------

TEST_F(T5EncoderTest, LayerNormIsRmsWithoutMeanOrBias) {
  remat::encoders::T5LayerNorm norm(16, 1e-6);
  norm->to(at::kDouble);
  {
    torch::NoGradGuard guard;
    norm->weight.uniform_(0.5, 1.5);
  }
  const auto x = torch::randn({5, 16}, torch::kDouble) * 3.0 + 1.0;  // non-zero mean: no centring
  const Matrix ref = rms_norm(to_matrix(x), to_vector(norm->weight), 1e-6);
  EXPECT_LT(max_abs_diff(norm->forward(x), ref), 1e-13);
  // fp32: statistics in fp32, output fp32.
  norm->to(at::kFloat);
  const auto y32 = norm->forward(x.to(at::kFloat));
  EXPECT_EQ(y32.scalar_type(), at::kFloat);
  EXPECT_LT(max_abs_diff(y32, ref), 1e-5);
  // bf16 weights: the normalised value is rounded to bf16 once, then multiplied in bf16.
  norm->to(at::kBFloat16);
  const auto xb = x.to(at::kBFloat16);
  const auto yb = norm->forward(xb);
  EXPECT_EQ(yb.scalar_type(), at::kBFloat16);
  const Matrix xbm = to_matrix(xb);
  const std::vector<double> wb = to_vector(norm->weight);
  const Matrix unit = rms_norm(xbm, std::vector<double>(16, 1.0), 1e-6);
  for (size_t i = 0; i < unit.size(); ++i) {
    for (size_t j = 0; j < unit[i].size(); ++j) {
      const double rounded = torch::tensor(unit[i][j], torch::kDouble).to(at::kBFloat16).item<double>();
      const double expected = torch::tensor(wb[j] * rounded, torch::kDouble).to(at::kBFloat16).item<double>();
      EXPECT_EQ(yb[i][j].item<double>(), expected) << i << "," << j;
    }
  }
}

// Both attention paths (the fused kernel where LibTorch has it, the formula in query chunks) against
// the float64 formula.
TEST_F(T5EncoderTest, AttentionHasNoScalingAndAddsBiasAndMask) {
  const T5Config c = T5Config::tiny();
  remat::encoders::T5Attention attn(c, true);
  attn->to(at::kDouble);
  {
    torch::NoGradGuard guard;
    for (auto& p : attn->parameters()) p.normal_(0.0, 0.4);
  }
  const int64_t L = 6;
  const auto x = torch::randn({1, L, c.d_model}, torch::kDouble);
  const std::vector<int> mask = {1, 1, 1, 1, 0, 0};
  at::Tensor bias = attn->compute_bias(L, L);
  ASSERT_EQ(bias.sizes(), (std::vector<int64_t>{1, c.num_heads, L, L}));
  const auto m = torch::tensor({1.0, 1.0, 1.0, 1.0, 0.0, 0.0}, torch::kDouble).view({1, 1, 1, L});
  const auto ref = attention(to_matrix(x[0]), to_matrix(attn->q->weight), to_matrix(attn->k->weight),
                             to_matrix(attn->v->weight), to_matrix(attn->o->weight), c.num_heads,
                             c.d_kv, position_bias(to_matrix(attn->relative_attention_bias->weight), c.num_heads, L),
                             mask);
  for (const bool fused : {false, true}) {
    attn->fused_attention = fused;
    const auto out = attn->forward(x, bias + (1.0 - m) * std::numeric_limits<double>::lowest());
    EXPECT_LT(max_abs_diff(out[0], ref), 1e-12) << "fused " << fused;
  }
}

// Note [T5 attention in query chunks]: any chunk size computes the same rows, bit for bit in
// float32 (the contracted dimensions are untouched), with a full mask and a per-key one.
TEST_F(T5EncoderTest, AttentionInQueryChunksEqualsTheWholeMatrix) {
  const T5Config c = T5Config::tiny();
  remat::encoders::T5Attention attn(c, true);
  attn->fused_attention = false;
  {
    torch::NoGradGuard guard;
    for (auto& p : attn->parameters()) p.normal_(0.0, 0.4);
  }
  const int64_t L = 7;
  const auto x = torch::randn({2, L, c.d_model});
  const at::Tensor bias = attn->compute_bias(L, L);
  const at::Tensor key_mask = (1.0 - torch::tensor({1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0}).view({1, 1, 1, L})) *
                              std::numeric_limits<float>::lowest();
  for (const at::Tensor& b : {bias, bias + key_mask}) {
    attn->query_chunk = L;
    const auto whole = attn->forward(x, b);
    for (const int64_t chunk : {1, 3, 0}) {
      attn->query_chunk = chunk;
      EXPECT_TRUE(torch::equal(attn->forward(x, b), whole)) << "query_chunk " << chunk;
    }
  }
}

// In bfloat16 the formula rounds the unscaled scores (T5 has no 1/sqrt(d)) to bf16 before the
// softmax; the fused kernel keeps them in fp32. Against float64 on the same bf16 weights and input
// the fused path is at least as close (strictly closer where LibTorch has the kernel: on 1.13 both
// run the formula), and in float32 the two paths agree to rounding.
TEST_F(T5EncoderTest, FusedAttentionIsTheFormulaAndRoundsLessInBfloat16) {
  const T5Config c = T5Config::tiny();
  remat::encoders::T5Attention attn(c, true);
  {
    torch::NoGradGuard guard;
    for (auto& p : attn->parameters()) p.normal_(0.0, 0.6);  // scores of a few units, as T5-XXL's
  }
  torch::NoGradGuard no_grad;
  const int64_t L = 24;
  const auto x = torch::randn({2, L, c.d_model});
  const at::Tensor key_mask = (1.0 - (torch::arange(L) < 20).to(at::kFloat).view({1, 1, 1, L})) *
                              std::numeric_limits<float>::lowest();
  auto run = [&](bool fused, at::ScalarType dtype) {
    attn->to(dtype);
    attn->fused_attention = fused;
    return attn->forward(x.to(dtype), attn->compute_bias(L, L) + key_mask.to(dtype)).to(at::kDouble);
  };
  auto rel = [](const at::Tensor& a, const at::Tensor& b) { return ((a - b).abs().max() / b.abs().max()).item<double>(); };
  EXPECT_LT(rel(run(true, at::kFloat), run(false, at::kFloat)), 1e-5);
  const at::Tensor fused = run(true, at::kBFloat16), formula = run(false, at::kBFloat16);
  const at::Tensor exact = run(false, at::kDouble);  // the bf16 weights, widened
  const double fused_error = rel(fused, exact), formula_error = rel(formula, exact);
  EXPECT_GT(formula_error, 0.0);
  if (remat::compat::kHasScaledDotProductAttention) {
    EXPECT_LT(fused_error, formula_error);
  } else {
    EXPECT_EQ(fused_error, formula_error);
  }
}

// Without autograd the blocks add the residuals and run the gated activation in place, and the
// model moves each block its input: the same bits as the autograd path, in float32 and bfloat16.
// With the fused kernel the weights are frozen (as the trainer's text encoders are): a position
// bias that requires grad makes PyTorch pick its math kernel instead, other bits by design.
TEST_F(T5EncoderTest, InferenceInPlaceEqualsTheAutogradPath) {
  for (const bool fused : {false, remat::compat::kHasScaledDotProductAttention}) {
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      auto model = random_tiny(dtype);
      for (const auto& block : *model->encoder->block) {
        block->as<remat::encoders::T5BlockImpl>()->self_attention->fused_attention = fused;
      }
      if (fused) {
        for (auto& p : model->parameters()) p.requires_grad_(false);
      }
      const auto input = torch::tensor({5, 17, 3, 200, 1, 0, 0, 0}).view({1, -1});
      ASSERT_TRUE(at::GradMode::is_enabled());
      const at::Tensor with_autograd = model->forward(input).detach();
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::equal(model->forward(input), with_autograd)) << dtype << " fused " << fused;
    }
  }
}

TEST_F(T5EncoderTest, GatedGeluFeedForward) {
  const T5Config c = T5Config::tiny();
  remat::encoders::T5DenseReluDense ff(c);
  ff->to(at::kDouble);
  {
    torch::NoGradGuard guard;
    for (auto& p : ff->parameters()) p.normal_(0.0, 0.5);
  }
  const auto x = torch::randn({7, c.d_model}, torch::kDouble);
  const auto ref = gated_gelu_ff(to_matrix(x), to_matrix(ff->wi_0->weight), to_matrix(ff->wi_1->weight),
                                 to_matrix(ff->wo->weight));
  EXPECT_LT(max_abs_diff(ff->forward(x), ref), 1e-12);
}

// ---- the whole model -------------------------------------------------------------------------

TEST_F(T5EncoderTest, TinyModelMatchesTheComposedFormulaInFloat64) {
  auto model = random_tiny();
  const std::vector<int64_t> ids = {5, 17, 3, 200, 1, 0, 0, 0};
  const auto input = torch::tensor(ids).view({1, -1});
  // No mask (as FluxPipeline calls it): pads are attended to.
  const auto out = model->forward(input);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{1, 8, 32}));
  EXPECT_LT(max_abs_diff(out[0], reference_forward(model, ids, std::vector<int>(8, 1))), 1e-10);
  // With the padding mask.
  const std::vector<int> mask = {1, 1, 1, 1, 1, 0, 0, 0};
  const auto masked = model->forward(input, torch::tensor({1, 1, 1, 1, 1, 0, 0, 0}).view({1, -1}));
  EXPECT_LT(max_abs_diff(masked[0], reference_forward(model, ids, mask)), 1e-10);
  // Masked pads change nothing for the real tokens: the bias depends on distances only.
  const auto unpadded = model->forward(input.narrow(1, 0, 5));
  EXPECT_LT((masked.narrow(1, 0, 5) - unpadded).abs().max().item<double>(), 1e-12);
  // Batch rows are independent.
  const auto batch = model->forward(torch::stack({input[0], torch::tensor({9, 9, 9, 1, 0, 0, 0, 0})}));
  EXPECT_LT((batch[0] - out[0]).abs().max().item<double>(), 1e-12);
}

TEST_F(T5EncoderTest, KeysAreTransformersT5EncoderModelKeys) {
  T5EncoderModel model(T5Config::tiny());
  std::set<std::string> keys;
  for (const auto& item : model->named_parameters()) keys.insert(item.key());
  std::set<std::string> expected = {"shared.weight", "encoder.final_layer_norm.weight",
                                    "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "encoder.block." + std::to_string(l) + ".layer.";
    for (const char* k : {"0.SelfAttention.q.weight", "0.SelfAttention.k.weight", "0.SelfAttention.v.weight",
                          "0.SelfAttention.o.weight", "0.layer_norm.weight", "1.DenseReluDense.wi_0.weight",
                          "1.DenseReluDense.wi_1.weight", "1.DenseReluDense.wo.weight", "1.layer_norm.weight"}) {
      expected.insert(p + k);
    }
  }
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(keys.size(), 21u);
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  EXPECT_EQ(total, parameter_count(T5Config::tiny()));
  EXPECT_EQ(model->named_parameters()["encoder.block.0.layer.0.SelfAttention.q.weight"].sizes(),
            (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(model->named_parameters()["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].sizes(),
            (std::vector<int64_t>{32, 4}));
}

// ---- loading ---------------------------------------------------------------------------------

TEST_F(T5EncoderTest, LoadsSharedOrEmbedTokensAndIgnoresTheDecoder) {
  auto model = random_tiny(at::kFloat);
  const auto ids = torch::tensor({{4, 8, 15, 16, 23, 42, 1, 0}});
  const auto expected = model->forward(ids);
  std::vector<remat::io::NamedTensor> entries = remat::io::module_state(*model);

  const std::string plain = temp("plain.safetensors");
  remat::io::save_safetensors(plain, entries);
  auto loaded = remat::encoders::load_t5_encoder({remat::io::SafetensorsFile::open(plain)}, T5Config::tiny(), at::kFloat);
  EXPECT_TRUE(torch::equal(loaded->forward(ids), expected));

  // The embedding under upstream's other name for the same tensor.
  std::vector<remat::io::NamedTensor> renamed;
  for (const auto& e : entries) {
    renamed.push_back({e.first == "shared.weight" ? "encoder.embed_tokens.weight" : e.first, e.second});
  }
  const std::string aliased = temp("aliased.safetensors");
  remat::io::save_safetensors(aliased, renamed);
  loaded = remat::encoders::load_t5_encoder({remat::io::SafetensorsFile::open(aliased)}, T5Config::tiny(), at::kFloat);
  EXPECT_TRUE(torch::equal(loaded->forward(ids), expected));

  // Both names, plus a full T5 checkpoint's decoder and LM head: ignored.
  auto full = entries;
  full.push_back({"encoder.embed_tokens.weight", param(model, "shared.weight")});
  full.push_back({"decoder.block.0.layer.0.SelfAttention.q.weight", torch::zeros({32, 32})});
  full.push_back({"decoder.final_layer_norm.weight", torch::zeros({32})});
  full.push_back({"lm_head.weight", torch::zeros({216, 32})});
  const std::string with_decoder = temp("full.safetensors");
  remat::io::save_safetensors(with_decoder, full);
  loaded = remat::encoders::load_t5_encoder({remat::io::SafetensorsFile::open(with_decoder)}, T5Config::tiny(), at::kFloat);
  EXPECT_TRUE(torch::equal(loaded->forward(ids), expected));

  // Sharded: two files, each key in exactly one.
  std::vector<remat::io::NamedTensor> first, second;
  for (size_t i = 0; i < entries.size(); ++i) (i % 2 ? first : second).push_back(entries[i]);
  const std::string shard1 = temp("shard1.safetensors"), shard2 = temp("shard2.safetensors");
  remat::io::save_safetensors(shard1, first);
  remat::io::save_safetensors(shard2, second);
  loaded = remat::encoders::load_t5_encoder(
      {remat::io::SafetensorsFile::open(shard1), remat::io::SafetensorsFile::open(shard2)}, T5Config::tiny(), at::kFloat);
  EXPECT_TRUE(torch::equal(loaded->forward(ids), expected));
  for (const auto& p : {plain, aliased, with_decoder, shard1, shard2}) std::remove(p.c_str());
}

TEST_F(T5EncoderTest, StrictLoadNamesFileAndKeys) {
  auto model = random_tiny(at::kFloat);
  std::vector<remat::io::NamedTensor> entries;
  for (const auto& e : remat::io::module_state(*model)) {
    if (e.first != "encoder.block.1.layer.1.layer_norm.weight") entries.push_back(e);
  }
  entries.push_back({"encoder.block.0.layer.0.SelfAttention.q.bias", torch::zeros({32})});
  const std::string path = temp("broken.safetensors");
  remat::io::save_safetensors(path, entries);
  const std::string message = error_of([&] {
    remat::encoders::load_t5_encoder({remat::io::SafetensorsFile::open(path)}, T5Config::tiny(), at::kFloat);
  });
  EXPECT_EQ(message.rfind("[t5] cannot load the T5 encoder from '" + path + "'", 0), 0u) << message;
  EXPECT_NE(message.find("encoder.block.1.layer.1.layer_norm.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("encoder.block.0.layer.0.SelfAttention.q.bias"), std::string::npos) << message;
  // A config that does not fit the file: shapes are named.
  T5Config wide = T5Config::tiny();
  wide.d_ff = 128;
  remat::io::save_safetensors(path, remat::io::module_state(*model));
  const std::string shapes = error_of([&] {
    remat::encoders::load_t5_encoder({remat::io::SafetensorsFile::open(path)}, wide, at::kFloat);
  });
  EXPECT_NE(shapes.find("encoder.block.0.layer.1.DenseReluDense.wi_0.weight"), std::string::npos) << shapes;
  std::remove(path.c_str());
}

// ---- reduced precision -----------------------------------------------------------------------

TEST_F(T5EncoderTest, Bfloat16RunsInBfloat16AndFp16KeepsWoInFloat32) {
  auto model = random_tiny(at::kFloat);
  const std::string path = temp("dtypes.safetensors");
  remat::io::save_module(path, *model);
  const auto ids = torch::tensor({{4, 8, 15, 16, 23, 42, 1, 0}});
  const auto file = remat::io::SafetensorsFile::open(path);

  auto bf16 = remat::encoders::load_t5_encoder({file}, T5Config::tiny(), at::kBFloat16);
  for (const auto& p : bf16->parameters()) EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  // Built in bf16 directly; the process's default dtype is restored afterwards.
  EXPECT_EQ(torch::empty({1}).scalar_type(), at::kFloat);
  const auto out_bf16 = bf16->forward(ids);
  EXPECT_EQ(out_bf16.scalar_type(), at::kBFloat16);
  // Against float64 on the same (bf16-rounded) weights: only activation rounding remains. The
  // random weights make scores large (no 1/sqrt(d)), so a few per cent is bf16's expected error.
  auto exact = random_tiny();
  {
    torch::NoGradGuard guard;
    auto src = bf16->named_parameters();
    for (auto& item : exact->named_parameters()) item.value().copy_(src[item.key()]);
  }
  const auto reference = exact->forward(ids);
  const double rel = ((out_bf16.to(at::kDouble) - reference).norm() / reference.norm()).item<double>();
  EXPECT_LT(rel, 0.1);
  EXPECT_GT(rel, 0.0);  // it really ran in bf16

  // fp16: wo stays fp32 (transformers' _keep_in_fp32_modules). LibTorch 1.13 has no fp16 matmul
  // on CPU, so the fp16 forward itself is exercised on GPUs only.
  auto fp16 = remat::encoders::load_t5_encoder({file}, T5Config::tiny(), at::kHalf);
  for (const auto& item : fp16->named_parameters()) {
    const bool wo = item.key().find("DenseReluDense.wo.") != std::string::npos;
    EXPECT_EQ(item.value().scalar_type(), wo ? at::kFloat : at::kHalf) << item.key();
  }
  std::remove(path.c_str());
}

TEST_F(T5EncoderTest, Fp16ClampMatchesUpstreamRule) {
  using remat::encoders::clamp_fp16_residual;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const auto finite = torch::tensor({-65504.0, 3.0, 65504.0}).to(at::kHalf);
  EXPECT_TRUE(torch::equal(clamp_fp16_residual(finite), finite));
  // An inf anywhere: everything is clamped to 1000 below the fp16 maximum, a bound that fp16
  // stores as its nearest value, 64512 (spacing 32 there).
  const auto inf = torch::tensor({-kInf, 3.0, 65504.0, kInf}).to(at::kHalf);
  const auto clamped = clamp_fp16_residual(inf);
  EXPECT_EQ(clamped.scalar_type(), at::kHalf);
  EXPECT_TRUE(torch::equal(clamped.to(at::kDouble), torch::tensor({-64512.0, 3.0, 64512.0, 64512.0}, torch::kDouble)))
      << clamped;
  // Other dtypes pass unchanged, inf included.
  const auto bf = torch::tensor({kInf, 1e30}).to(at::kBFloat16);
  EXPECT_TRUE(torch::equal(clamp_fp16_residual(bf), bf));
}

TEST_F(T5EncoderTest, RejectsBadInputs) {
  T5EncoderModel model(T5Config::tiny());
  EXPECT_EQ(error_text([&] { model->forward(torch::tensor({{1, 216}})); }),
            "[t5] input_ids must be in [0, 216), got values in [1, 216]");
  EXPECT_NE(error_of([&] { model->forward(torch::tensor({1, 2})); }).find("[t5] input_ids must be (B, L)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model->forward(torch::tensor({{1, 2}}), torch::tensor({{1, 1, 0}})); })
                .find("[t5] attention_mask must have the shape of input_ids"),
            std::string::npos);
}

}  // namespace t5_encoder_test
}  // namespace
