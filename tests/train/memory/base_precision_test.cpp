// base_model_precision in training (remat/train/memory/base_precision.h): SimpleTuner's names parsed or
// refused by name, LoRA only, memory admission at the quantised size (against the byte formulas
// written here), and short training runs on an int8 and an NF4 base against the full-precision
// run on the same weights.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include "remat/io/safetensors.h"
#include "remat/models/flux.h"
#include "remat/models/mageflow.h"
#include "remat/models/lora.h"
#include "remat/train/memory/admission.h"
#include "remat/train/memory/auto_layout.h"
#include "remat/train/memory/base_precision.h"
#include "remat/train/memory/benchmark.h"
#include "remat/train/options/config.h"
#include "remat/train/data/data.h"
#include "remat/train/family/family.h"
#include "remat/train/options/options.h"
#include "remat/train/run/step.h"
#include "remat/train/run/trainer.h"
#include "train/quiet_hooks.h"
#include "temp_dir.h"
#include "value_error.h"
#include "flux_tiny_dataset.h"

namespace remat::train {
namespace {
namespace base_precision_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::quiet_hooks;

const Environment kCpu{false};

std::vector<std::string> errors_of(const ValidationReport& r) {
  std::vector<std::string> out;
  for (const auto& d : r.diagnostics) {
    if (d.severity == Diagnostic::Severity::Error) out.push_back(d.message);
  }
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

// SimpleTuner's choices (helpers/training/__init__.py quantised_precision_levels, bc8e6ab7).
const std::vector<std::string> kSimpleTunerNames = {
    "no_change",  "int8-quanto", "int4-quanto",  "int2-quanto",  "int8-torchao", "int8dq-torchao",
    "int8dq-int4-torchao", "int8-sdnq", "uint8-sdnq", "int16-sdnq", "uint16-sdnq", "fp16-sdnq",
    "fp8-sdnq",   "int6-sdnq",   "int5-sdnq",    "uint5-sdnq",   "uint4-sdnq",   "uint3-sdnq",
    "uint2-sdnq", "nf4-bnb",     "int4-torchao", "fp8-quanto",   "fp8uz-quanto", "fp8-native",
    "fp8-torchao", "fp8wo-torchao", "fp8-int4-torchao", "fp8-transformerengine"};

TEST(BaseModelPrecision, EverySimpleTunerNameIsAChoiceMappedOrRefusedByName) {
  const OptionSpec* spec = find_option("base_model_precision");
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(spec->choices, kSimpleTunerNames);
  EXPECT_EQ(spec->default_value, std::optional<std::string>("no_change"));
  for (const auto& name : kSimpleTunerNames) {
    const bool refused = spec->unsupported_values.count(name) > 0;
    bool parses = true;
    try {
      models::parse_base_model_precision(name);
    } catch (const c10::ValueError&) {
      parses = false;
    }
    // Exactly one of: remat implements it (fp8 only with float8 dtypes), or it is refused by name.
    const bool fp8_gated = base_model_precision_unavailable(name).has_value();
    EXPECT_NE(refused, parses || fp8_gated) << name;
  }
  for (const char* implemented : {"no_change", "int8-quanto", "int8-torchao", "nf4-bnb"}) {
    EXPECT_EQ(spec->unsupported_values.count(implemented), 0u) << implemented;
  }
}

TEST(BaseModelPrecision, LoraRunsAcceptTheImplementedNames) {
  for (const char* name : {"int8-quanto", "int8-torchao", "nf4-bnb"}) {
    const auto r = validate_option_values({{"base_model_precision", name}, {"model_type", "lora"}}, kCpu);
    EXPECT_TRUE(r.ok()) << name << ": " << joined(errors_of(r));
    EXPECT_EQ(r.config.base_model_precision, name);
    const models::BasePrecision p = base_precision_of(r.config);
    EXPECT_EQ(p.mode, std::string(name) == "nf4-bnb" ? models::WeightQuantization::nf4 : models::WeightQuantization::int8);
    EXPECT_EQ(p.double_quantization, std::string(name) == "nf4-bnb");  // SimpleTuner's bnb config
  }
}

TEST(BaseModelPrecision, UnsupportedNamesAreRefusedByNameWithWhatRematHas) {
  const auto r = validate_option_values({{"base_model_precision", "int8dq-torchao"}, {"model_type", "lora"}}, kCpu);
  const auto errors = errors_of(r);
  ASSERT_EQ(errors.size(), 1u) << joined(errors);
  EXPECT_NE(errors[0].find("[train] base_model_precision=int8dq-torchao is not supported by remat yet: it needs int8 "
                           "quantisation of the activations"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("remat quantises with int8-quanto, int8-torchao, nf4-bnb"), std::string::npos) << errors[0];
  // A name outside SimpleTuner's vocabulary is a plain choice error.
  const auto typo = errors_of(validate_option_values({{"base_model_precision", "int8-quant"}}, kCpu));
  ASSERT_EQ(typo.size(), 1u);
  EXPECT_NE(typo[0].find("did you mean 'int8-quanto'?"), std::string::npos) << typo[0];
}

TEST(BaseModelPrecision, Fp8NeedsFloat8Dtypes) {
  const auto r = validate_option_values({{"base_model_precision", "fp8-quanto"}, {"model_type", "lora"}}, kCpu);
  if (models::float8_supported()) {
    EXPECT_TRUE(r.ok()) << joined(errors_of(r));
  } else {
    const auto errors = errors_of(r);
    ASSERT_EQ(errors.size(), 1u) << joined(errors);
    EXPECT_NE(errors[0].find("base_model_precision=fp8-quanto is not supported by remat yet: it needs float8 dtypes, "
                             "which LibTorch has from 2.1"),
              std::string::npos)
        << errors[0];
  }
}

// `remat bench` and `remat sample` read the option through the registry's row: the same choices
// and refusals as `remat train`, under their own tag.
TEST(BaseModelPrecision, OneParserForBenchAndSample) {
  EXPECT_EQ(parse_base_model_precision_option("int8-quanto", "bench").mode, models::WeightQuantization::int8);
  EXPECT_EQ(parse_base_model_precision_option("nf4-bnb", "sample").mode, models::WeightQuantization::nf4);
  EXPECT_EQ(parse_base_model_precision_option("no_change", "sample").mode, models::WeightQuantization::none);
  EXPECT_EQ(parse_base_model_precision_option("", "sample").mode, models::WeightQuantization::none);  // the default
  const auto message = [](const std::string& text, const std::string& command) {
    try {
      parse_base_model_precision_option(text, command);
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.option(), "base_model_precision");
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string unknown = message("int9-quanto", "bench");
  EXPECT_EQ(unknown.rfind("[bench] base_model_precision must be one of no_change, ", 0), 0u) << unknown;
  EXPECT_NE(unknown.find("got 'int9-quanto'"), std::string::npos) << unknown;
  const std::string lacking = message("int4-quanto", "sample");
  EXPECT_EQ(lacking.rfind("[sample] base_model_precision int4-quanto is not supported by remat: it needs ", 0), 0u)
      << lacking;
  if (!models::float8_supported()) {
    EXPECT_EQ(message("fp8-quanto", "bench").rfind("[bench] base_model_precision fp8-quanto needs float8 dtypes", 0), 0u);
  }
}

TEST(BaseModelPrecision, AFullFineTuneIsRefused) {
  const auto errors = errors_of(validate_option_values({{"base_model_precision", "int8-quanto"}, {"model_type", "full"}}, kCpu));
  ASSERT_EQ(errors.size(), 1u) << joined(errors);
  EXPECT_NE(errors[0].find("[train] base_model_precision=int8-quanto quantises the frozen base weights, which only "
                           "LoRA training has: model_type=full"),
            std::string::npos)
      << errors[0];
  // --ignore_unsupported_options does not make it a different run silently.
  EXPECT_EQ(errors_of(validate_option_values({{"base_model_precision", "nf4-bnb"}, {"ignore_unsupported_options", "true"}}, kCpu)).size(), 1u);
  BenchmarkOptions bench;
  bench.model.family = "flux";
  bench.base_model_precision = "int8-quanto";
  bench.lora_rank = 0;
  try {
    run_benchmark(bench);
    FAIL() << "a full fine-tune on a quantised base must be refused";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("pass --lora_rank > 0"), std::string::npos) << e.what();
  }
}

TEST(BaseModelPrecision, SimpleTunerConfigWithInt8QuantoNeedsNoOverride) {
  remat::testing::TempDir dir{"remat_base_precision_config"};
  const fs::path path = dir.path() / "config.json";
  std::ofstream(path) << R"({"model_family": "flux", "model_type": "lora", "base_model_precision": "int8-quanto",
    "lora_rank": 16, "quantize_via": "accelerator", "base_model_default_dtype": "bf16",
    "output_dir": ")" << (dir.path() / "out").string() << R"(", "instance_data_dir": ")" << dir.path().string() << R"("})";
  std::vector<std::string> warnings;
  const TrainConfig config = load_train_config({"--config=" + path.string()}, warnings);
  EXPECT_EQ(config.base_model_precision, "int8-quanto");
  EXPECT_FALSE(config.ignore_unsupported_options);
}

// ---- admission ----

// The test's own rules: which Flux Linears are quantised (the blocks' and the final modulation),
// and the bytes of each mode (int8: a byte per weight + a float32 scale per row; NF4 with
// bitsandbytes' double quantisation: half a byte per weight, a byte per block of 64, a float32
// absmax per 256 block scales, a float32 mean).
bool quantized_in_test(const std::string& name) {
  return name.rfind("transformer_blocks.", 0) == 0 || name.rfind("single_transformer_blocks.", 0) == 0 ||
         name == "norm_out.linear";
}

double int8_bytes(double out, double in) { return out * in + 4 * out; }
double nf4_bytes(double out, double in) {
  const double n = out * in, blocks = std::ceil(n / 64);
  return std::ceil(n / 2) + blocks + 4 * std::ceil(blocks / 256) + 4;
}

struct Expected {
  double weights = 0, largest = 0;
  int64_t quantized = 0;
};

Expected expected_weights(const std::string& flavour, double element_bytes, bool nf4) {
  const auto config = models::FluxConfig::preset(flavour);
  Expected e;
  e.weights = static_cast<double>(models::parameter_count(config)) * element_bytes;
  for (const auto& l : models::linear_layers(config)) {
    if (!quantized_in_test(l.name)) continue;
    const double out = static_cast<double>(l.out_features), in = static_cast<double>(l.in_features);
    e.weights += (nf4 ? nf4_bytes(out, in) : int8_bytes(out, in)) - out * in * element_bytes;
    e.largest = std::max(e.largest, out * in);
    e.quantized += 1;
  }
  return e;
}

TransformerSpec flux(const std::string& flavour) {
  TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = flavour;
  return spec;
}

TEST(BaseModelPrecisionAdmission, QuantisedLinearsAtTheirSizeTheRestFullPlusOneDequantisedLayer) {
  for (const char* name : {"int8-quanto", "nf4-bnb"}) {
    for (const int64_t element_bytes : {4, 2}) {
      ModelUse use;
      use.weight_element_bytes = element_bytes;
      use.base_precision = models::parse_base_model_precision(name);
      const auto d = predict_model_memory(flux("flux-dev"), use);
      ASSERT_TRUE(d.has_value());
      const Expected e = expected_weights("flux-dev", static_cast<double>(element_bytes), std::string(name) == "nf4-bnb");
      EXPECT_EQ(static_cast<double>(d->weight_bytes), e.weights) << name << " " << element_bytes;
      EXPECT_EQ(d->quantized_linears, e.quantized) << name;
      // The transient: the largest layer dequantised through two float32 tensors, plus the cast.
      EXPECT_EQ(static_cast<double>(d->dequantized_transient_bytes),
                e.largest * (8 + (element_bytes == 4 ? 0 : element_bytes))) << name;
      EXPECT_EQ(d->total(), d->weight_bytes + d->dequantized_transient_bytes);
    }
  }
  // flux-dev's blocks hold nearly all of it: int8 is about a quarter of float32, NF4 an eighth.
  ModelUse fp32;
  const double full = static_cast<double>(predict_model_memory(flux("flux-dev"), fp32)->weight_bytes);
  EXPECT_LT(expected_weights("flux-dev", 4, false).weights / full, 0.26);
  EXPECT_LT(expected_weights("flux-dev", 4, true).weights / full, 0.15);
}

TEST(BaseModelPrecisionAdmission, TheRefusalSuggestsThePrecisionThatFits) {
  ModelUse lora;
  lora.training = true;
  lora.lora_rank = 16;
  lora.lora_target = "all";
  lora.lora_flag = "--model_type=lora";
  lora.precision_flag = "--base_model_precision";
  const int64_t factors = models::lora_parameter_count(models::linear_layers(models::FluxConfig::preset("flux-dev")),
                                                       models::flux_lora_target_modules("all"), 16);
  // Weights + factors (float32) + gradients and AdamW state of the factors + the transient.
  const auto need = [&](bool nf4) {
    const Expected e = expected_weights("flux-dev", 4, nf4);
    return e.weights + 4.0 * factors + 12.0 * factors + 8.0 * e.largest;
  };
  // Between the NF4 and the int8 demand: only NF4 is suggested.
  const int64_t available = static_cast<int64_t>((need(true) + need(false)) / 2);
  try {
    admit_model(flux("flux-dev"), lora, at::Device(at::kCPU), available);
    FAIL() << "float32 flux-dev does not fit";
  } catch (const ValidationError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("These would fit: --base_model_precision=nf4-bnb ("), std::string::npos) << text;
    EXPECT_EQ(text.find("--base_model_precision=int8-quanto"), std::string::npos) << text;
  }
  // An int8 run that does not fit is told about NF4, and its own demand names the quantised bytes.
  ModelUse int8 = lora;
  int8.base_precision = models::parse_base_model_precision("int8-quanto");
  try {
    admit_model(flux("flux-dev"), int8, at::Device(at::kCPU), available);
    FAIL() << "int8 flux-dev needs more than " << available;
  } catch (const ValidationError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("Linears quantised to"), std::string::npos) << text;
    EXPECT_NE(text.find("--base_model_precision=nf4-bnb ("), std::string::npos) << text;
  }
  EXPECT_NO_THROW(admit_model(flux("flux-dev"), int8, at::Device(at::kCPU), static_cast<int64_t>(need(false)) + 1));
}

// ---- the planner's step model (interval auto, remat bench) ----

// flux-tiny with LoRA on a base at `precision`, after one step (the optimizer state exists).
struct QuantizedRun {
  std::unique_ptr<Transformer> model;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  Batch batch;
  at::Generator generator = at::detail::createCPUGenerator(7);
  StepSettings settings;

  explicit QuantizedRun(const std::string& precision) {
    torch::manual_seed(0);
    TransformerSpec spec = flux("flux-tiny");
    spec.base_precision = models::parse_base_model_precision(precision);
    model = make_transformer(spec, at::Device(at::kCPU));
    model->apply_lora("default", 4, 4.0);
    model->module().train();
    for (const auto& item : model->trainable_parameters()) params.push_back(item.second);
    optimizer = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-4));
    batch = model->synthetic_batch(1, 64, 16, generator, at::Device(at::kCPU));
    model->set_checkpoint_plan(CheckpointPlan::from_layouts({layout_from_interval(2, 1), layout_from_interval(2, 1)}));
    measured_peak();
  }

  int64_t measured_peak() {
    int64_t peak = 0;
    for (int i = 0; i < 2; ++i) {
      peak = std::max(peak, run_training_step(*model, *optimizer, params, batch, settings, generator).peak_bytes);
    }
    return peak;
  }
};

TEST(BaseModelPrecisionPlanner, StepModelCountsQuantisedWeightsAndAutoStaysWithinBudget) {
  // One model alive at a time: the step model reads the process's live bytes.
  int64_t full_fixed_bytes = 0;
  {
    QuantizedRun full("no_change");
    full_fixed_bytes = profile_step(*full.model, *full.optimizer, full.params, full.batch, full.settings, full.generator)
                           .chain.fixed_bytes;
  }
  for (const char* precision : {"int8-quanto", "nf4-bnb"}) {
    QuantizedRun q(precision);
    const StepModel step = profile_step(*q.model, *q.optimizer, q.params, q.batch, q.settings, q.generator);
    // What stays live through the step shrinks by exactly the weights' saving (float32 -> the
    // quantised bytes of the test's formulas).
    const Expected e = expected_weights("flux-tiny", 4, std::string(precision) == "nf4-bnb");
    const double saving = static_cast<double>(models::parameter_count(models::FluxConfig::preset("flux-tiny"))) * 4 - e.weights;
    const double measured_saving = static_cast<double>(full_fixed_bytes - step.chain.fixed_bytes);
    EXPECT_NEAR(measured_saving, saving, 0.02 * saving) << precision;
    // interval auto: the chosen layout's measured peak stays within the budget, predicted within 5%.
    const int64_t keep_all = predict(step.chain, layout_keep_all(step.chain.num_blocks())).peak_bytes;
    const int64_t min_peak = plan_layout(step.chain, 1).min_possible_peak;
    for (int64_t budget : {min_peak, min_peak + (keep_all - min_peak) / 2, keep_all}) {
      const AutoLayout chosen = plan_auto_layout(step, budget);
      q.model->set_checkpoint_plan(CheckpointPlan::from_layouts(chosen.stack_layouts));
      const int64_t measured = q.measured_peak();
      EXPECT_LE(measured, budget) << precision << " budget " << budget;
      const double error = std::abs(static_cast<double>(chosen.plan.prediction.peak_bytes - measured)) /
                           static_cast<double>(measured);
      EXPECT_LT(error, 0.05) << precision << ": predicted " << chosen.plan.prediction.peak_bytes << ", measured " << measured;
    }
  }
}

// ---- training ----

class QuantizedTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    remat::testing::make_flux_tiny_dataset((root_ / "data").string(), 8);
    // One set of base weights for every precision, so the runs differ only by quantisation.
    torch::manual_seed(5);
    models::Flux model(models::FluxConfig::preset("flux-tiny"));
    io::save_module((root_ / "base.safetensors").string(), *model);
  }

  TrainResult train(const std::string& precision, int steps = 3) {
    std::vector<std::string> warnings;
    const TrainConfig config = load_train_config(
        {"--model_family=flux", "--model_flavour=flux-tiny", "--model_type=lora", "--lora_rank=4",
         "--pretrained_model_name_or_path=" + (root_ / "base.safetensors").string(),
         "--instance_data_dir=" + (root_ / "data").string(),
         "--output_dir=" + (root_ / (precision + "-" + std::to_string(steps))).string(), "--train_batch_size=2",
         "--learning_rate=1e-2", "--lr_scheduler=constant", "--mixed_precision=no",
         "--gradient_checkpointing_interval=1", "--seed=3", "--checkpointing_steps=0",
         "--max_train_steps=" + std::to_string(steps), "--base_model_precision=" + precision},
        warnings);
    return run_training(config, quiet_hooks());
  }

  static int64_t run_peak(const TrainResult& result) {
    int64_t peak = 0;
    for (const auto& r : result.records) peak = std::max(peak, r.peak_bytes);
    return peak;
  }

  remat::testing::TempDir dir_{"remat_quantized_training"};
  const fs::path& root_ = dir_.path();
};

TEST_F(QuantizedTraining, Int8AndNf4BasesTrainThreeStepsCloseToFullPrecision) {
  const TrainResult full = train("no_change");
  ASSERT_EQ(full.records.size(), 3u);
  // Stated margins for the first step's loss (same weights, data, noise): int8's per-channel
  // rounding moves it by under 0.1%, NF4's 16 levels by under 1%.
  const std::vector<std::pair<std::string, double>> runs = {{"int8-quanto", 1e-3}, {"nf4-bnb", 1e-2}};
  for (const auto& run : runs) {
    const TrainResult q = train(run.first);
    ASSERT_EQ(q.final_step, 3) << run.first;
    ASSERT_EQ(q.records.size(), 3u) << run.first;
    for (const auto& r : q.records) EXPECT_TRUE(std::isfinite(r.loss)) << run.first;
    const double a = full.records[0].loss, b = q.records[0].loss;
    std::printf("[ first-step loss ] no_change %.6f, %s %.6f (relative difference %.2e)\n", a, run.first.c_str(), b,
                std::abs(a - b) / a);
    EXPECT_LT(std::abs(a - b) / a, run.second) << run.first << ": " << a << " vs " << b;
    EXPECT_NE(a, b) << run.first << " did not quantise anything";
    // The LoRA written at the end holds only the factors, as in full precision.
    const auto file = io::SafetensorsFile::open(q.weights_path);
    const auto reference = io::SafetensorsFile::open(full.weights_path);
    EXPECT_EQ(file.names(), reference.names()) << run.first;
  }
}

// float8 base weights (e4m3, one scale per output channel) exist from LibTorch 2.1: there, both
// of SimpleTuner's fp8 names train a LoRA whose loss falls, from a first step within 2% of the
// full-precision base's (3 mantissa bits: per-weight error up to 2^-4), with a step peak below the
// full-precision base's. Without float8 dtypes (LibTorch 1.13) the run is refused, naming both.
TEST_F(QuantizedTraining, Fp8BasesTrainWhereFloat8DtypesExist) {
  if (!models::float8_supported()) {
    for (const std::string name : {"fp8-quanto", "fp8wo-torchao"}) {
      const std::string error = remat::testing::error_of([&] { train(name); });
      EXPECT_NE(error.find("base_model_precision=" + name + " is not supported by remat yet: it needs float8 dtypes, "
                           "which LibTorch has from 2.1"),
                std::string::npos)
          << error;
    }
    return;
  }
  constexpr int kSteps = 30;
  const TrainResult full = train("no_change", kSteps);
  for (const std::string name : {"fp8-quanto", "fp8wo-torchao"}) {
    const TrainResult q = train(name, kSteps);
    ASSERT_EQ(q.records.size(), static_cast<size_t>(kSteps)) << name;
    double head = 0, tail = 0;
    for (int i = 0; i < 10; ++i) {
      head += q.records[i].loss / 10;
      tail += q.records[kSteps - 10 + i].loss / 10;
    }
    const double a = full.records[0].loss, b = q.records[0].loss;
    std::printf("[ %s ] first-step loss %.6f (no_change %.6f); mean of the first / last 10 steps %.4f / %.4f; "
                "step peak %lld bytes (no_change %lld)\n",
                name.c_str(), b, a, head, tail, static_cast<long long>(run_peak(q)),
                static_cast<long long>(run_peak(full)));
    EXPECT_LT(std::abs(a - b) / a, 2e-2) << name << ": " << a << " vs " << b;
    EXPECT_NE(a, b) << name << " did not quantise anything";
    EXPECT_LT(tail, 0.9 * head) << name;
    EXPECT_LT(run_peak(q), run_peak(full)) << name;
  }
}

// MageFlow's blocks quantise through the same Linears: a 3-step LoRA run from one saved base at
// each precision, first-step loss within the same margins as Flux's.
TEST(QuantizedMageFlowTraining, Int8AndNf4BasesTrainThreeStepsCloseToFullPrecision) {
  remat::testing::TempDir dir("remat_quantized_mageflow");
  const fs::path& root = dir.path();
  DemoDatasetOptions options;
  options.sizes = {{4, 4}};
  options.text_tokens = 6;
  options.joint_attention_dim = 32;  // mageflow-tiny context_in_dim
  make_demo_dataset((root / "data").string(), model_family("mageflow").latents, 8, 5, options);
  torch::manual_seed(5);
  models::MageFlow base(models::MageFlowConfig::preset("mageflow-tiny"));
  io::save_module((root / "base.safetensors").string(), *base);

  const auto train = [&root](const std::string& precision) {
    std::vector<std::string> warnings;
    const TrainConfig config = load_train_config(
        {"--model_family=mageflow", "--model_flavour=mageflow-tiny", "--model_type=lora", "--lora_rank=2",
         "--pretrained_model_name_or_path=" + (root / "base.safetensors").string(),
         "--instance_data_dir=" + (root / "data").string(), "--output_dir=" + (root / precision).string(),
         "--train_batch_size=2", "--learning_rate=1e-2", "--mixed_precision=no",
         "--gradient_checkpointing_interval=2", "--seed=1", "--checkpointing_steps=0", "--max_train_steps=3",
         "--base_model_precision=" + precision},
        warnings);
    return run_training(config, quiet_hooks());
  };
  const TrainResult full = train("no_change");
  ASSERT_EQ(full.records.size(), 3u);
  const std::vector<std::pair<std::string, double>> runs = {{"int8-quanto", 1e-3}, {"nf4-bnb", 1e-2}};
  for (const auto& run : runs) {
    const TrainResult q = train(run.first);
    ASSERT_EQ(q.records.size(), 3u) << run.first;
    for (const auto& r : q.records) EXPECT_TRUE(std::isfinite(r.loss)) << run.first;
    const double a = full.records[0].loss, b = q.records[0].loss;
    EXPECT_LT(std::abs(a - b) / a, run.second) << run.first << ": " << a << " vs " << b;
    EXPECT_NE(a, b) << run.first << " did not quantise anything";
    EXPECT_EQ(io::SafetensorsFile::open(q.weights_path).names(),
              io::SafetensorsFile::open(full.weights_path).names())
        << run.first;
  }
}

}  // namespace base_precision_test
}  // namespace
}  // namespace remat::train
