// Shared layers against the formulas of the upstream code (diffusers' FluxPosEmbed,
// get_timestep_embedding, FluxPipeline._pack_latents, RMSNorm; the vendored MageFlow
// get_timestep_embedding in SimpleTuner) evaluated independently here in float64 loops:
// RoPE tables and rotation, timestep sinusoids (Flux and MageFlow), latent packing, norms.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "models/model_test_util.h"
#include "models/reference_ops.h"
#include "remat/models/blocks.h"
#include "remat/models/flux.h"
#include "remat/models/layers.h"

namespace remat::models {
namespace {
namespace layers_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using test::close;

class LayersTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(0); }
};

TEST_F(LayersTest, FluxRopeTablesMatchFormula) {
  const std::vector<int64_t> axes = {4, 6, 6};
  auto ids = torch::tensor({0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 3.f, 5.f, 0.f, 7.f, 1.f}).view({4, 3});
  const auto tables = flux_rope_tables(ids, axes);
  ASSERT_EQ(tables.cos.sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(tables.cos.scalar_type(), torch::kFloat32);
  auto c = tables.cos.accessor<float, 2>();
  auto s = tables.sin.accessor<float, 2>();
  auto id = ids.accessor<float, 2>();
  for (int64_t n = 0; n < 4; ++n) {
    int64_t lane = 0;
    for (size_t a = 0; a < axes.size(); ++a) {
      for (int64_t j = 0; j < axes[a] / 2; ++j) {
        const double angle = id[n][a] / std::pow(10000.0, 2.0 * j / axes[a]);
        for (int rep = 0; rep < 2; ++rep, ++lane) {
          EXPECT_EQ(c[n][lane], static_cast<float>(std::cos(angle))) << n << "," << lane;
          EXPECT_EQ(s[n][lane], static_cast<float>(std::sin(angle))) << n << "," << lane;
        }
      }
    }
  }
  // Text rows (ids 0) are unrotated.
  EXPECT_TRUE(torch::equal(tables.cos[0], torch::ones({16})));
}

TEST_F(LayersTest, ApplyRopeRotatesAdjacentPairs) {
  const int64_t B = 2, N = 3, H = 2, d = 4;
  const auto x = torch::randn({B, N, H, d}, torch::kFloat64);
  const auto angle = torch::rand({N, d / 2}, torch::kFloat64) * 6.0;
  RotaryTables tables{angle.cos().to(torch::kFloat32).repeat_interleave(2, 1),
                      angle.sin().to(torch::kFloat32).repeat_interleave(2, 1)};
  const auto out = apply_rope(x, tables);
  auto expected = torch::empty_like(x);
  auto xa = x.accessor<double, 4>();
  auto ea = expected.accessor<double, 4>();
  auto an = angle.accessor<double, 2>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < d / 2; ++j) {
          const double cs = static_cast<float>(std::cos(an[n][j]));
          const double sn = static_cast<float>(std::sin(an[n][j]));
          const double x0 = xa[b][n][h][2 * j], x1 = xa[b][n][h][2 * j + 1];
          ea[b][n][h][2 * j] = x0 * cs - x1 * sn;
          ea[b][n][h][2 * j + 1] = x1 * cs + x0 * sn;
        }
  EXPECT_TRUE(close(out, expected, 1e-12, 1e-12));
  // float32 input: computed in float32 and returned as float32.
  const auto out32 = apply_rope(x.to(torch::kFloat32), tables);
  EXPECT_EQ(out32.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(close(out32, expected, 1e-5, 1e-5));
}

TEST_F(LayersTest, FluxTimestepProjectionMatchesFormula) {
  const auto t = torch::tensor({0.0f, 1.0f, 250.5f, 1000.0f});
  const auto emb = flux_timestep_projection(t, 256);
  ASSERT_EQ(emb.sizes(), (std::vector<int64_t>{4, 256}));
  auto expected = torch::empty({4, 256}, torch::kFloat64);
  auto ea = expected.accessor<double, 2>();
  auto ta = t.accessor<float, 1>();
  for (int64_t b = 0; b < 4; ++b) {
    for (int64_t k = 0; k < 128; ++k) {
      const double arg = ta[b] * std::exp(-std::log(10000.0) * k / 128.0);
      ea[b][k] = std::cos(arg);  // flip_sin_to_cos: cos first
      ea[b][128 + k] = std::sin(arg);
    }
  }
  // float32 frequencies and arguments up to 1000: absolute error ~1e-4.
  EXPECT_TRUE(close(emb, expected, 0, 2e-4));
}

TEST_F(LayersTest, MageFlowTimestepProjectionRoundsInTheActivationDtype) {
  const auto sigma = torch::tensor({0.0f, 0.123456f, 0.5f, 0.987654f});
  std::vector<double> values;
  for (int64_t b = 0; b < 4; ++b) values.push_back(sigma[b].item<float>());
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat64}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto emb = mageflow_timestep_projection(sigma, 256, dtype);
    EXPECT_EQ(emb.scalar_type(), dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32);
    // float32 frequencies and arguments up to 1000: absolute error ~1e-4.
    EXPECT_TRUE(close(emb, test::reference::ref_mageflow_sinusoid(values, dtype), 0, 2e-4));
  }
  // bfloat16 rounding moves the result far beyond that: each check above is sensitive to it.
  EXPECT_FALSE(close(mageflow_timestep_projection(sigma, 256, torch::kFloat32),
                     test::reference::ref_mageflow_sinusoid(values, torch::kBFloat16), 0, 1e-2));
  EXPECT_FALSE(close(mageflow_timestep_projection(sigma, 256, torch::kBFloat16),
                     test::reference::ref_mageflow_sinusoid(values, torch::kFloat32), 0, 1e-2));
}

TEST_F(LayersTest, PackUnpackAndImageIds) {
  const int64_t B = 2, C = 3, h = 4, w = 6;
  const auto z = torch::randn({B, C, h, w});
  const auto packed = flux_pack_latents(z);
  ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{B, (h / 2) * (w / 2), 4 * C}));
  auto pa = packed.accessor<float, 3>();
  auto za = z.accessor<float, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < h / 2; ++r)
      for (int64_t c = 0; c < w / 2; ++c)
        for (int64_t ch = 0; ch < C; ++ch)
          for (int64_t dy = 0; dy < 2; ++dy)
            for (int64_t dx = 0; dx < 2; ++dx)
              ASSERT_EQ(pa[b][r * (w / 2) + c][ch * 4 + dy * 2 + dx], za[b][ch][2 * r + dy][2 * c + dx]);
  EXPECT_TRUE(torch::equal(flux_unpack_latents(packed, h, w), z));
  const auto ids = flux_image_ids(h / 2, w / 2);
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{(h / 2) * (w / 2), 3}));
  auto ia = ids.accessor<float, 2>();
  for (int64_t r = 0; r < h / 2; ++r)
    for (int64_t c = 0; c < w / 2; ++c) {
      EXPECT_EQ(ia[r * (w / 2) + c][0], 0.f);
      EXPECT_EQ(ia[r * (w / 2) + c][1], static_cast<float>(r));
      EXPECT_EQ(ia[r * (w / 2) + c][2], static_cast<float>(c));
    }
  EXPECT_THROW(flux_pack_latents(torch::randn({1, 3, 5, 4})), c10::Error);
}

TEST_F(LayersTest, NormsAndActivations) {
  const auto x = torch::randn({3, 8}, torch::kFloat64) * 3 + 1;
  const auto mean = x.mean(-1, true);
  const auto var = (x - mean).pow(2).mean(-1, true);
  EXPECT_TRUE(close(layer_norm(x), (x - mean) / (var + 1e-6).sqrt(), 1e-12, 1e-12));
  RMSNorm rms(8);
  rms->to(torch::kFloat64);
  {
    torch::NoGradGuard g;
    rms->weight.copy_(torch::randn({8}, torch::kFloat64));
  }
  EXPECT_TRUE(close(rms->forward(x), x / (x.pow(2).mean(-1, true) + 1e-6).sqrt() * rms->weight, 1e-12, 1e-12));
  const auto g = 0.5 * x * (1 + (std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))).tanh());
  EXPECT_TRUE(close(gelu_tanh(x), g, 1e-12, 1e-12));
  // bfloat16 weight: normalised in float32, cast to bfloat16, then multiplied.
  RMSNorm rms_bf16(8);
  rms_bf16->to(torch::kBFloat16);
  const auto xb = x.to(torch::kBFloat16);
  const auto xf = xb.to(torch::kFloat32);
  const auto want = (xf / (xf.pow(2).mean(-1, true) + 1e-6).sqrt()).to(torch::kBFloat16) * rms_bf16->weight;
  EXPECT_TRUE(torch::equal(rms_bf16->forward(xb), want));
}

TEST_F(LayersTest, LinearWithLora) {
  Linear linear(6, 4);
  linear->to(torch::kFloat64);
  const auto x = torch::randn({2, 6}, torch::kFloat64);
  const auto base = linear->forward(x);
  EXPECT_TRUE(close(base, x.matmul(linear->weight.t()) + linear->bias, 1e-12, 1e-12));
  linear->enable_lora(3, 6.0);
  EXPECT_TRUE(torch::equal(linear->forward(x), base));  // B starts at zero
  EXPECT_EQ(linear->lora_A->weight.sizes(), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(linear->lora_B->weight.sizes(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(linear->lora_A->weight.scalar_type(), torch::kFloat64);
  // PEFT init of A: kaiming-uniform(a = sqrt(5)) -> U(-1/sqrt(in), 1/sqrt(in)).
  EXPECT_LE(linear->lora_A->weight.abs().max().item<double>(), 1.0 / std::sqrt(6.0));
  EXPECT_GT(linear->lora_A->weight.abs().max().item<double>(), 0.0);
  {
    torch::NoGradGuard g;
    linear->lora_B->weight.copy_(torch::randn({4, 3}, torch::kFloat64));
  }
  const auto delta = x.matmul(linear->lora_A->weight.t()).matmul(linear->lora_B->weight.t()) * (6.0 / 3.0);
  EXPECT_TRUE(close(linear->forward(x), base + delta, 1e-12, 1e-12));
  EXPECT_THROW(linear->enable_lora(3, 6.0), c10::Error);
  Linear other(6, 4);
  EXPECT_THROW(other->enable_lora(0, 1.0), c10::Error);
}

}  // namespace layers_test
}  // namespace
}  // namespace remat::models
