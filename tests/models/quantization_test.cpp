// Weight-only quantisation (remat/models/quantization.h) against float64 formulas written here:
// int8 per channel, QLoRA's NF4 code book and block scales, bitsandbytes' double quantisation;
// the quantised Linear against its dequantised reference (forward, input gradient, LoRA
// gradients), and checkpoint recomputation against no checkpointing.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/model_test_util.h"
#include "value_error.h"
#include "remat/checkpoint_plan.h"
#include "remat/memory.h"
#include "remat/models/flux.h"
#include "remat/models/layers.h"
#include "remat/models/lora.h"
#include "remat/models/quantization.h"

namespace remat::models {
namespace {
namespace quantization_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

// ---- float64 references -------------------------------------------------------------------

// Standard normal quantile by bisection on Phi(x) = erfc(-x / sqrt 2) / 2.
double normal_ppf(double p) {
  double lo = -40.0, hi = 40.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

std::vector<double> linspace(double a, double b, int n) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) out.push_back(a + (b - a) * i / (n - 1));
  return out;
}

// QLoRA appendix E (bitsandbytes create_normal_map, offset 0.9677083, use_extra_value): 8
// positive quantiles over linspace(offset, 0.5, 9)[:-1], 7 negative over linspace(offset, 0.5,
// 8)[:-1], an exact zero, normalised by the largest, ascending.
std::vector<double> nf4_reference() {
  const double offset = 0.9677083;
  std::vector<double> v;
  auto pos = linspace(offset, 0.5, 9);
  for (int i = 0; i < 8; ++i) v.push_back(normal_ppf(pos[i]));
  auto neg = linspace(offset, 0.5, 8);
  for (int i = 0; i < 7; ++i) v.push_back(-normal_ppf(neg[i]));
  v.push_back(0.0);
  const double top = *std::max_element(v.begin(), v.end());
  for (auto& x : v) x /= top;
  std::sort(v.begin(), v.end());
  return v;
}

// bitsandbytes create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8).
std::vector<double> dynamic_reference() {
  std::vector<double> v;
  for (int i = 0; i < 7; ++i) {
    const auto b = linspace(0.1, 1.0, (1 << i) + 1);
    for (size_t k = 0; k + 1 < b.size(); ++k) {
      const double mean = (b[k] + b[k + 1]) / 2;
      v.push_back(std::pow(10.0, -6 + i) * mean);
      v.push_back(-std::pow(10.0, -6 + i) * mean);
    }
  }
  v.push_back(0.0);
  v.push_back(1.0);
  std::sort(v.begin(), v.end());
  return v;
}

// Index of the nearest code (first on ties), and whether x lies within `eps` of a midpoint
// (float32 and float64 arithmetic may then round to either neighbour).
struct Nearest {
  int index;
  bool near_tie;
};
Nearest nearest(double x, const std::vector<double>& code, double eps) {
  int best = 0;
  for (int k = 1; k < static_cast<int>(code.size()); ++k) {
    if (std::abs(x - code[k]) < std::abs(x - code[best])) best = k;
  }
  bool tie = false;
  for (size_t k = 0; k + 1 < code.size(); ++k) tie = tie || std::abs(x - (code[k] + code[k + 1]) / 2) < eps;
  return {best, tie};
}

std::vector<double> to_vector(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous().reshape({-1});
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

// The NF4 codes of `q`, unpacked in bitsandbytes' order (even element in the high nibble).
std::vector<int> unpack_nf4(const QuantizedWeight& q) {
  std::vector<int> out;
  const at::Tensor data = q.data.contiguous();
  const uint8_t* p = data.data_ptr<uint8_t>();
  for (int64_t i = 0; i < data.numel(); ++i) {
    out.push_back(p[i] >> 4);
    out.push_back(p[i] & 15);
  }
  out.resize(static_cast<size_t>(q.out_features * q.in_features));
  return out;
}

// A weight with outliers, a zero row and a nearly constant row: the cases scales get wrong.
at::Tensor structured_weight(int64_t out, int64_t in) {
  at::Tensor w = torch::randn({out, in}) * 0.05;
  w[0].zero_();
  w[1].fill_(0.3);
  w[2][3] = 4.0;  // an outlier
  return w;
}

// ---- round trips ---------------------------------------------------------------------------

TEST(QuantizationTest, Int8PerChannelMatchesFloat64Formula) {
  torch::manual_seed(1);
  const at::Tensor w = structured_weight(7, 37).to(at::kBFloat16);
  const QuantizedWeight q = quantize_weight(w, WeightQuantization::int8);
  ASSERT_EQ(q.data.scalar_type(), at::kChar);
  ASSERT_EQ(q.scales.scalar_type(), at::kFloat);
  EXPECT_EQ(q.bytes(), 7 * 37 + 7 * 4);
  EXPECT_EQ(q.bytes(), quantized_weight_bytes(7, 37, parse_base_model_precision("int8-quanto")));
  const auto wv = to_vector(w), codes = to_vector(q.data), scales = to_vector(q.scales);
  const auto deq = to_vector(dequantize_weight(q, at::kFloat));
  int compared = 0;
  for (int r = 0; r < 7; ++r) {
    double absmax = 0;
    for (int c = 0; c < 37; ++c) absmax = std::max(absmax, std::abs(wv[r * 37 + c]));
    const double scale = absmax / 127;  // symmetric: absmax maps onto 127
    EXPECT_NEAR(scales[r], scale, 1e-7 * scale + 1e-30) << "row " << r;
    for (int c = 0; c < 37; ++c) {
      const double ratio = scale == 0 ? 0 : wv[r * 37 + c] / scale;
      const double code = std::max(-127.0, std::min(127.0, std::nearbyint(ratio)));
      const double frac = ratio - std::floor(ratio);
      if (std::abs(frac - 0.5) < 1e-4) continue;  // a near tie may round either way in float32
      EXPECT_EQ(codes[r * 37 + c], code) << r << "," << c;
      EXPECT_NEAR(deq[r * 37 + c], code * scale, 1e-6 * std::abs(code * scale) + 1e-12);
      ++compared;
    }
  }
  EXPECT_GT(compared, 7 * 37 * 9 / 10);
  // The zero row stays exactly zero.
  EXPECT_EQ(dequantize_weight(q, at::kFloat)[0].abs().max().item<float>(), 0.0f);
}

TEST(QuantizationTest, Nf4CodeBookIsQloraNormalFloat) {
  const auto want = nf4_reference();
  const auto& got = nf4_code_book();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-7) << i;
  EXPECT_EQ(got[7], 0.0f);
  EXPECT_EQ(got[0], -1.0f);
  EXPECT_EQ(got[15], 1.0f);
}

TEST(QuantizationTest, DynamicCodeIsBitsandbytesSignedMap) {
  const auto want = dynamic_reference();
  const auto& got = dynamic_8bit_code();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-7 * std::abs(want[i]) + 1e-12) << i;
}

// NF4 codes and block absmax against the float64 formula; shapes with a partial last block and
// an odd element count.
void check_nf4_blocks(int64_t out, int64_t in) {
  torch::manual_seed(2);
  const at::Tensor w = structured_weight(out, in);
  const QuantizedWeight q = quantize_weight(w, WeightQuantization::nf4);
  const int64_t n = out * in, blocks = (n + 63) / 64;
  ASSERT_EQ(q.data.numel(), (n + 1) / 2);
  ASSERT_EQ(q.scales.numel(), blocks);
  EXPECT_EQ(q.bytes(), quantized_weight_bytes(out, in, BasePrecision{"nf4", WeightQuantization::nf4, false}));
  const auto code = nf4_reference();
  const auto wv = to_vector(w), scales = to_vector(q.scales);
  const auto deq = to_vector(dequantize_weight(q, at::kDouble));
  const auto codes = unpack_nf4(q);
  int compared = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    double absmax = 0;
    for (int64_t i = b * 64; i < std::min(n, (b + 1) * 64); ++i) absmax = std::max(absmax, std::abs(wv[i]));
    EXPECT_NEAR(scales[b], absmax, 1e-7 * absmax) << "block " << b;
    for (int64_t i = b * 64; i < std::min(n, (b + 1) * 64); ++i) {
      const auto nr = nearest(absmax == 0 ? 0 : wv[i] / absmax, code, 1e-6);
      if (nr.near_tie) continue;
      EXPECT_EQ(codes[i], nr.index) << "element " << i;
      EXPECT_NEAR(deq[i], code[nr.index] * absmax, 1e-6 * absmax + 1e-12);
      ++compared;
    }
  }
  EXPECT_GT(compared, n * 9 / 10);
}

TEST(QuantizationTest, Nf4BlocksMatchFloat64Formula) {
  check_nf4_blocks(6, 50);  // 300 weights: 4 whole blocks and a partial one
  check_nf4_blocks(5, 27);  // 135: odd, the last byte holds one code
}

TEST(QuantizationTest, Nf4DoubleQuantizationMatchesBitsandbytesScheme) {
  torch::manual_seed(3);
  // 400 blocks of 64: two second-level blocks of 256 and 144 scales.
  const at::Tensor w = structured_weight(40, 640);
  const QuantizedWeight single = quantize_weight(w, WeightQuantization::nf4);
  const QuantizedWeight q = quantize_weight(w, WeightQuantization::nf4, /*double_quantization=*/true);
  ASSERT_EQ(q.scales.scalar_type(), at::kByte);
  ASSERT_EQ(q.scales.numel(), 400);
  ASSERT_EQ(q.scale_scales.numel(), 2);
  EXPECT_TRUE(torch::equal(q.data, single.data)) << "double quantisation changes only the scales";
  EXPECT_EQ(q.bytes(), quantized_weight_bytes(40, 640, parse_base_model_precision("nf4-bnb")));
  EXPECT_EQ(q.bytes(), 12800 + 400 + 2 * 4 + 4);

  const auto absmax = to_vector(single.scales);
  double mean = 0;
  for (double a : absmax) mean += a;
  mean /= static_cast<double>(absmax.size());
  EXPECT_NEAR(q.scale_offset.item<double>(), mean, 1e-6 * mean);
  const auto code = dynamic_reference();
  const auto idx = to_vector(q.scales), ss = to_vector(q.scale_scales);
  std::vector<double> block_scale(absmax.size());
  int compared = 0;
  for (int64_t sb = 0; sb < 2; ++sb) {
    const int64_t lo = sb * 256, hi = std::min<int64_t>(400, lo + 256);
    double m = 0;
    for (int64_t i = lo; i < hi; ++i) m = std::max(m, std::abs(absmax[i] - mean));
    EXPECT_NEAR(ss[sb], m, 1e-6 * m) << "second-level block " << sb;
    for (int64_t i = lo; i < hi; ++i) {
      const auto nr = nearest((absmax[i] - mean) / m, code, 1e-6);
      block_scale[i] = code[static_cast<size_t>(idx[i])] * m + mean;
      if (nr.near_tie) continue;
      EXPECT_EQ(idx[i], nr.index) << "scale " << i;
      ++compared;
    }
  }
  EXPECT_GT(compared, 360);
  // Weights dequantise as NF4 code x (8-bit code x second-level absmax + mean).
  const auto nf4 = nf4_reference();
  const auto codes = unpack_nf4(q);
  const auto deq = to_vector(dequantize_weight(q, at::kDouble));
  double worst = 0;
  for (size_t i = 0; i < deq.size(); ++i) {
    worst = std::max(worst, std::abs(deq[i] - nf4[codes[i]] * block_scale[i / 64]));
  }
  EXPECT_LT(worst, 1e-6);
}

TEST(QuantizationTest, Fp8NeedsFloat8Dtypes) {
  const at::Tensor w = torch::randn({4, 8});
  if (!float8_supported()) {
    // Debian's LibTorch 1.13: a clear error naming the requirement, for the mode and its names.
    const std::string error = remat::testing::error_of([&] { quantize_weight(w, WeightQuantization::fp8); });
    EXPECT_NE(error.find("2.1"), std::string::npos) << error;
    EXPECT_NE(remat::testing::error_of([] { parse_base_model_precision("fp8-quanto"); }).find("float8"), std::string::npos);
    EXPECT_NE(remat::testing::error_of([] { parse_base_model_precision("fp8wo-torchao"); }).find("float8"), std::string::npos);
  } else {
    const QuantizedWeight q = quantize_weight(w, WeightQuantization::fp8);
    // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 per element above the subnormals.
    const at::Tensor deq = dequantize_weight(q, at::kFloat);
    const at::Tensor bound = w.abs() * 0.0625 + q.scales.unsqueeze(1) * 448 * std::pow(2.0, -9);
    EXPECT_TRUE(((deq - w).abs() <= bound).all().item<bool>());
  }
}

TEST(QuantizationTest, SimpleTunerNamesMapOrAreRefusedByName) {
  EXPECT_EQ(parse_base_model_precision("no_change").mode, WeightQuantization::none);
  EXPECT_EQ(parse_base_model_precision("int8-quanto").mode, WeightQuantization::int8);
  EXPECT_EQ(parse_base_model_precision("int8-torchao").mode, WeightQuantization::int8);
  const auto nf4 = parse_base_model_precision("nf4-bnb");
  EXPECT_EQ(nf4.mode, WeightQuantization::nf4);
  EXPECT_TRUE(nf4.double_quantization);
  // Every other choice of SimpleTuner's --base_model_precision is refused naming itself.
  for (const char* name : {"int4-quanto", "int2-quanto", "int8dq-torchao", "int8dq-int4-torchao", "int4-torchao",
                           "fp8uz-quanto", "fp8-native", "fp8-torchao", "fp8-int4-torchao", "fp8-transformerengine"}) {
    const std::string error = remat::testing::error_of([&] { parse_base_model_precision(name); });
    EXPECT_NE(error.find(std::string("[quant] base_model_precision ") + name), std::string::npos) << error;
    EXPECT_NE(error.find("int8-quanto"), std::string::npos) << error;
  }
  EXPECT_NE(remat::testing::error_of([] { parse_base_model_precision("bogus"); }).find("nf4-bnb"), std::string::npos);
  const auto names = supported_base_model_precisions();
  EXPECT_EQ(names.front(), "no_change");
}

TEST(QuantizationTest, WhichLinearsAreQuantized) {
  for (const char* yes : {"transformer_blocks.0.attn.to_q", "single_transformer_blocks.3.proj_out",
                          "transformer_blocks.1.norm1.linear", "transformer_blocks.0.ff.net.0.proj",
                          "norm_out.linear", "transformer_blocks.2.img_mod.1"}) {
    EXPECT_TRUE(is_quantized_linear_name(yes)) << yes;
  }
  for (const char* no : {"x_embedder", "context_embedder", "proj_out", "time_text_embed.text_embedder.linear_1",
                         "img_in", "txt_in", "transformer_blocks.0.attn.to_q.lora_A"}) {
    EXPECT_FALSE(is_quantized_linear_name(no)) << no;
  }
}

// ---- the quantised Linear ------------------------------------------------------------------

struct ModeCase {
  const char* label;
  WeightQuantization mode;
  bool double_quantization;
};
const ModeCase kModes[] = {{"int8", WeightQuantization::int8, false},
                           {"nf4", WeightQuantization::nf4, false},
                           {"nf4+dq", WeightQuantization::nf4, true}};

TEST(QuantizationTest, QuantizedLinearForwardAndInputGradientMatchDequantizedReference) {
  torch::manual_seed(4);
  const at::Tensor w = torch::randn({48, 40}) * 0.1;
  const at::Tensor bias = torch::randn({48});
  const at::Tensor x0 = torch::randn({2, 5, 40});
  const at::Tensor upstream = torch::randn({2, 5, 48});
  for (const auto& m : kModes) {
    const QuantizedWeight q = quantize_weight(w, m.mode, m.double_quantization);
    at::Tensor x = x0.clone().requires_grad_(true);
    const int64_t before = memory::current_bytes();
    at::Tensor y = quantized_linear(x, q, bias);
    // Nothing big is saved for backward: the output and a few bytes, never the dequantised weight.
    EXPECT_LT(memory::current_bytes() - before, static_cast<int64_t>(y.nbytes()) + 1024) << m.label;
    (y * upstream).sum().backward();

    at::Tensor xr = x0.clone().requires_grad_(true);
    at::Tensor yr = at::linear(xr, dequantize_weight(q, at::kFloat), bias);
    (yr * upstream).sum().backward();
    EXPECT_TRUE(test::close(y, yr, 1e-6, 1e-6)) << m.label;
    EXPECT_TRUE(test::close(x.grad(), xr.grad(), 1e-6, 1e-6)) << m.label;
    // In float64 the two agree to rounding.
    at::Tensor xd = x0.to(at::kDouble).requires_grad_(true);
    at::Tensor yd = quantized_linear(xd, q, bias.to(at::kDouble));
    EXPECT_EQ(yd.scalar_type(), at::kDouble);
    EXPECT_TRUE(test::close(yd, at::linear(x0.to(at::kDouble), dequantize_weight(q, at::kDouble), bias.to(at::kDouble)),
                            1e-12, 1e-12))
        << m.label;
  }
}

// Two identical flux-tiny models in float64, LoRA on both: one with a quantised base, one whose
// base weights are the dequantised values.
struct TwinModels {
  Flux quantized{nullptr}, reference{nullptr};
};
TwinModels twin_models(const ModeCase& m) {
  TwinModels t;
  torch::manual_seed(5);
  t.quantized = Flux(FluxConfig::preset("flux-tiny"));
  torch::manual_seed(5);
  t.reference = Flux(FluxConfig::preset("flux-tiny"));
  const auto names =
      quantize_linear_layers(*t.quantized, BasePrecision{m.label, m.mode, m.double_quantization});
  EXPECT_GT(names.size(), 20u);
  std::map<std::string, LinearImpl*> ref;
  for (const auto& item : t.reference->named_modules("", false)) {
    if (auto* l = dynamic_cast<LinearImpl*>(item.value().get())) ref[item.key()] = l;
  }
  {
    torch::NoGradGuard g;
    for (const auto& item : t.quantized->named_modules("", false)) {
      auto* l = dynamic_cast<LinearImpl*>(item.value().get());
      if (l != nullptr && l->is_quantized()) ref.at(item.key())->weight.copy_(l->full_weight());
    }
  }
  t.quantized->to(at::kDouble);
  t.reference->to(at::kDouble);
  for (Flux* model : {&t.quantized, &t.reference}) {
    torch::manual_seed(6);
    apply_lora(**model, flux_lora_target_modules("all"), 4, 8.0);
    torch::manual_seed(7);
    torch::NoGradGuard g;
    for (auto& p : lora_parameters(**model)) p.copy_(torch::randn_like(p) * 0.1);
  }
  return t;
}

test::RunResult run_flux(Flux& model, int64_t seed) {
  torch::manual_seed(seed);
  const auto opts = torch::TensorOptions().dtype(at::kDouble);
  const std::vector<at::Tensor> inputs = {torch::randn({2, 16, 64}, opts), torch::randn({2, 8, 32}, opts),
                                          torch::randn({2, 16}, opts)};
  const at::Tensor t = torch::tensor({0.3, 0.8}, opts), g = torch::tensor({3.5, 4.0}, opts);
  const at::Tensor weight = torch::randn({2, 16, 64}, opts);
  const at::Tensor img = flux_image_ids(4, 4), txt = flux_text_ids(8);
  return test::run_with_grads(
      *model, inputs,
      [&](const std::vector<at::Tensor>& in) { return model->forward(in[0], in[1], in[2], t, img, txt, g); }, weight);
}

TEST(QuantizationTest, LoraGradientsThroughQuantizedBaseEqualDequantizedBase) {
  for (const auto& m : kModes) {
    TwinModels t = twin_models(m);
    t.quantized->train();
    t.reference->train();
    const auto got = run_flux(t.quantized, 8);
    const auto want = run_flux(t.reference, 8);
    // Same weights, same float64 arithmetic up to the order of the bias add: 1e-10 relative.
    int lora = 0;
    for (const auto& [name, grad] : want.param_grads) {
      if (name.find(".lora_") == std::string::npos) continue;
      ASSERT_TRUE(got.param_grads.count(name)) << m.label << " " << name;
      EXPECT_TRUE(test::close(got.param_grads.at(name), grad, 1e-10, 1e-12)) << m.label << " " << name;
      ++lora;
    }
    EXPECT_GT(lora, 40) << m.label;
    EXPECT_TRUE(test::close(got.output, want.output, 1e-10, 1e-12)) << m.label;
    EXPECT_TRUE(test::close(got.input_grads[0], want.input_grads[0], 1e-10, 1e-12)) << m.label;
  }
}

TEST(QuantizationTest, CheckpointRecomputationIsBitwiseEqualToNoCheckpointing) {
  // flux-tiny, NF4 with double quantisation and int8, LoRA, segmented checkpointing interval 2.
  for (const auto& m : {kModes[0], kModes[2]}) {
    TwinModels t = twin_models(m);
    Flux& model = t.quantized;
    model->train();
    model->set_checkpoint_plan(CheckpointPlan::off());
    const auto off = run_flux(model, 9);
    model->set_checkpoint_plan(CheckpointPlan::simpletuner(true, 2, std::nullopt, "torch"));
    const auto on = run_flux(model, 9);
    EXPECT_TRUE(torch::equal(on.output, off.output)) << m.label;
    int compared = 0;
    for (const auto& [name, grad] : off.param_grads) {
      if (!grad.defined()) continue;
      EXPECT_TRUE(torch::equal(on.param_grads.at(name), grad)) << m.label << " " << name;
      ++compared;
    }
    EXPECT_GT(compared, 40) << m.label;
    EXPECT_LT(on.retained_bytes, off.retained_bytes) << m.label;
  }
}

TEST(QuantizationTest, LinearWithoutWeightParameterCopes) {
  torch::manual_seed(10);
  Linear l(16, 8);
  const at::Tensor full = l->weight.detach().clone();
  quantize_linear_layers(*l, parse_base_model_precision("int8-quanto"));  // the root has no name: not quantised
  EXPECT_FALSE(l->is_quantized());
  l->set_quantized_weight(quantize_weight(full, WeightQuantization::int8));
  EXPECT_FALSE(l->weight.defined());
  for (const auto& p : l->named_parameters()) EXPECT_NE(p.key(), "weight");
  EXPECT_EQ(l->weight_dtype(), at::kFloat);
  l->to(at::kDouble);
  EXPECT_EQ(l->weight_dtype(), at::kDouble);
  l->enable_lora(2, 2.0);
  EXPECT_EQ(l->lora_A->weight.scalar_type(), at::kDouble);
  EXPECT_EQ(l->forward(torch::randn({3, 16}, at::kDouble)).scalar_type(), at::kDouble);
  EXPECT_TRUE(test::close(l->full_weight().to(at::kFloat), full, 0, full.abs().max().item<double>() / 127));
}

}  // namespace quantization_test
}  // namespace
}  // namespace remat::models
