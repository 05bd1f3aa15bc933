// Building Flux and MageFlow quantised without their full-precision weights, and loading them
// from safetensors while streaming: the tracking allocator's peak during build + load is at most
// the quantised model plus one full-precision (float32) tensor. Each loaded layer holds exactly
// what quantize_weight makes of the file's tensor.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "models/flux_formats_test_util.h"
#include "models/model_test_util.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "remat/models/flux_weight_formats.h"
#include "remat/models/layers.h"
#include "remat/models/quantized_loading.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::models {
namespace {
namespace quantized_loading_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

// flux-small with hidden 256 (2 heads x 128): weights of up to 1280 x 256, several times the
// quantisers' working chunk, so the peak bound is a real constraint.
FluxConfig loading_config() {
  FluxConfig c = FluxConfig::preset("flux-small");
  c.attention_head_dim = 128;
  c.axes_dims_rope = {16, 56, 56};
  return c;
}

std::map<std::string, LinearImpl*> linears_of(torch::nn::Module& model) {
  std::map<std::string, LinearImpl*> out;
  for (const auto& item : model.named_modules("", false)) {
    if (auto* l = dynamic_cast<LinearImpl*>(item.value().get())) out[item.key()] = l;
  }
  return out;
}

int64_t largest_linear_float32_bytes(const std::vector<LinearShape>& layers) {
  int64_t best = 0;
  for (const auto& l : layers) best = std::max(best, l.in_features * l.out_features * 4);
  return best;
}

// Every Linear of `loaded`: quantised ones hold quantize_weight(source weight) bit for bit, the
// others the source's weight; every other parameter equals the source's.
void expect_loaded_from(torch::nn::Module& loaded, torch::nn::Module& source, const BasePrecision& precision) {
  auto src = linears_of(source);
  int quantized = 0;
  for (const auto& [name, l] : linears_of(loaded)) {
    ASSERT_FALSE(l->is_deferred()) << name;
    if (is_quantized_linear_name(name)) {
      ASSERT_TRUE(l->is_quantized()) << name;
      const QuantizedWeight want = quantize_weight(src.at(name)->weight, precision.mode, precision.double_quantization);
      EXPECT_TRUE(torch::equal(l->quantized_weight().data, want.data)) << name;
      EXPECT_TRUE(torch::equal(l->quantized_weight().scales, want.scales)) << name;
      ++quantized;
    } else {
      EXPECT_FALSE(l->is_quantized()) << name;
    }
  }
  EXPECT_GE(quantized, 10);
  std::map<std::string, at::Tensor> params;
  for (const auto& p : source.named_parameters()) params[p.key()] = p.value();
  for (const auto& p : loaded.named_parameters()) {
    ASSERT_TRUE(params.count(p.key())) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), params.at(p.key()))) << p.key();
  }
}

TEST(QuantizedLoadingTest, FluxStreamsFromSafetensorsWithinOneFullTensorOfTheQuantizedModel) {
  remat::testing::TempDir dir{"quant_load"};
  const FluxConfig config = loading_config();
  Flux source = test::random_flux(config, 1);
  const std::string diffusers = dir / "diffusers.safetensors";
  const std::string bfl = dir / "bfl.safetensors";
  io::save_module(diffusers, *source);
  io::save_safetensors(bfl, test::test_diffusers_to_bfl(test::diffusers_state(*source), config));
  const int64_t one_full = largest_linear_float32_bytes(linear_layers(config));
  const int64_t full_model = parameter_count(config) * 4;

  for (const char* name : {"int8-quanto", "nf4-bnb"}) {
    const BasePrecision precision = parse_base_model_precision(name);
    // The source quantised in place: what every loaded model must compute.
    Flux in_place = test::random_flux(config, 1);
    quantize_linear_layers(*in_place, precision);
    const at::Tensor want = test::forward_once(*in_place);
    for (const std::string& path : {diffusers, bfl}) {
      const std::vector<io::SafetensorsFile> files{io::SafetensorsFile::open(path)};
      memory::PeakScope scope;
      Flux loaded = make_quantized_flux(config, precision, &files);
      const int64_t model_bytes = memory::current_bytes() - scope.baseline_bytes();
      const int64_t peak = scope.peak_delta();
      std::printf("[quant load] %s %s: model %lld B, peak %lld B, one full tensor %lld B, float32 model %lld B\n",
                  name, path == bfl ? "bfl" : "diffusers", static_cast<long long>(model_bytes),
                  static_cast<long long>(peak), static_cast<long long>(one_full), static_cast<long long>(full_model));
      EXPECT_LE(peak, model_bytes + one_full) << name << " " << path;
      EXPECT_LT(model_bytes, full_model / 2) << name;
      expect_loaded_from(*loaded, *source, precision);
      EXPECT_TRUE(torch::equal(test::forward_once(*loaded), want)) << name << " " << path;
    }
  }
}

TEST(QuantizedLoadingTest, RandomlyInitialisedQuantizedFluxHasTheMemoryModelsBytes) {
  // flux-small as the families build it: float32, measured by the tracking allocator, against
  // quantized_weight_bytes per quantised Linear plus 4 bytes per other parameter.
  const FluxConfig config = FluxConfig::preset("flux-small");
  const auto layers = linear_layers(config);
  for (const char* name : {"no_change", "int8-quanto", "nf4-bnb"}) {
    const BasePrecision precision = parse_base_model_precision(name);
    int64_t want = parameter_count(config) * 4;
    for (const auto& l : layers) {
      if (precision.mode == WeightQuantization::none || !is_quantized_linear_name(l.name)) continue;
      want += quantized_weight_bytes(l.out_features, l.in_features, precision) - l.in_features * l.out_features * 4;
    }
    memory::PeakScope scope;
    Flux model = make_quantized_flux(config, precision);
    const int64_t held = memory::current_bytes() - scope.baseline_bytes();
    std::printf("[quant bytes] flux-small %s: %lld B held (%s), peak while building %lld B\n", name,
                static_cast<long long>(held), memory::format_bytes(held).c_str(),
                static_cast<long long>(scope.peak_delta()));
    EXPECT_EQ(held, want) << name;
    // One full float32 weight (the initialiser's) plus the quantisers' chunk-sized working set.
    EXPECT_LE(scope.peak_delta(), held + largest_linear_float32_bytes(layers) + 32 * kQuantizeChunkElements) << name;
    EXPECT_EQ(test::forward_once(*model).sizes(), (std::vector<int64_t>{1, 4, 64})) << name;
  }
}

TEST(QuantizedLoadingTest, MageFlowLoadsQuantizedFromDiffusersLayout) {
  remat::testing::TempDir dir{"quant_mageflow"};
  const MageFlowConfig config = MageFlowConfig::preset("mageflow-tiny");
  torch::manual_seed(3);
  MageFlow source(config);
  const std::string path = dir / "mageflow.safetensors";
  io::save_module(path, *source);
  const BasePrecision precision = parse_base_model_precision("int8-torchao");
  const std::vector<io::SafetensorsFile> files{io::SafetensorsFile::open(path)};
  MageFlow loaded = make_quantized_mageflow(config, precision, &files);
  expect_loaded_from(*loaded, *source, precision);
}

TEST(QuantizedLoadingTest, AFileForAnotherShapeIsRefusedNamingTheKey) {
  remat::testing::TempDir dir{"quant_shape"};
  const FluxConfig tiny = FluxConfig::preset("flux-tiny");
  FluxConfig other = tiny;
  other.num_layers = 1;
  Flux small = test::random_flux(other, 2);
  const std::string path = dir / "other.safetensors";
  io::save_module(path, *small);
  const std::vector<io::SafetensorsFile> files{io::SafetensorsFile::open(path)};
  const std::string error =
      remat::testing::error_of([&] { make_quantized_flux(tiny, parse_base_model_precision("nf4-bnb"), &files); });
  EXPECT_NE(error.find("transformer_blocks.1."), std::string::npos) << error;
}

}  // namespace quantized_loading_test
}  // namespace
}  // namespace remat::models
