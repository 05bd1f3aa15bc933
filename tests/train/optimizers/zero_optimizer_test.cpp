// ZeRO-1 in one process: the assignment of tensors to ranks, deepspeed_config's forms and
// refusals, and the memory model's per-rank figures (the two-process run is
// zero_two_process_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>

#include <torch/torch.h>

#include "remat/memory.h"
#include "remat/train/memory/admission.h"
#include "remat/train/memory/benchmark.h"
#include "remat/train/options/config.h"
#include "remat/train/family/family.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/optimizers/zero_optimizer.h"
#include "temp_dir.h"

namespace remat::train {
namespace {
namespace zero_optimizer_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

// The greedy rule restated: each tensor, in order, to a rank whose load is the smallest (the lowest
// such rank), checked against the loads recomputed here.
void expect_greedy(const std::vector<int64_t>& sizes, int world_size) {
  const std::vector<int> owners = assign_to_ranks(sizes, world_size);
  ASSERT_EQ(owners.size(), sizes.size());  // every tensor owned exactly once
  std::vector<int64_t> load(world_size, 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_GE(owners[i], 0);
    ASSERT_LT(owners[i], world_size);
    const int64_t least = *std::min_element(load.begin(), load.end());
    EXPECT_EQ(load[owners[i]], least) << "tensor " << i << " went to a rank with more than the least";
    for (int r = 0; r < owners[i]; ++r) EXPECT_GT(load[r], least) << "tie not broken to the lowest rank";
    load[owners[i]] += sizes[i];
  }
  EXPECT_EQ(bytes_per_rank(sizes, owners, world_size), load);
  // Balanced: no rank holds more than the smallest plus the largest tensor.
  const int64_t largest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), largest);
  EXPECT_EQ(owners, assign_to_ranks(sizes, world_size)) << "not deterministic";
}

TEST(ZeroAssignment, GreedyBalancedDeterministic) {
  EXPECT_EQ(assign_to_ranks({10, 10, 10, 10}, 2), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(assign_to_ranks({100, 1, 1, 1}, 2), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(assign_to_ranks({5, 7}, 4), (std::vector<int>{0, 1}));  // ranks 2 and 3 own nothing
  torch::manual_seed(0);
  for (int world_size : {1, 2, 3, 8}) {
    const at::Tensor random = torch::randint(1, 1 << 20, {257}, torch::kLong);
    std::vector<int64_t> sizes(random.data_ptr<int64_t>(), random.data_ptr<int64_t>() + random.numel());
    expect_greedy(sizes, world_size);
  }
  // Flux-dev's Linear weights on 8 ranks: the largest shard is within 2% of an equal split.
  TransformerSpec dev;
  dev.family = "flux";
  dev.flavour = "flux-dev";
  std::vector<int64_t> sizes;
  for (const auto& l : model_family("flux").linear_layers(dev)) sizes.push_back(l.in_features * l.out_features * 4);
  expect_greedy(sizes, 8);
  const auto load = bytes_per_rank(sizes, assign_to_ranks(sizes, 8), 8);
  const double total = static_cast<double>(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}));
  EXPECT_LT(static_cast<double>(*std::max_element(load.begin(), load.end())), total / 8 * 1.02);
}

TEST(ZeroAssignment, BadArgumentsAreRefused) {
  EXPECT_THROW(assign_to_ranks({1}, 0), c10::ValueError);
  EXPECT_THROW(assign_to_ranks({-1}, 2), c10::ValueError);
  EXPECT_THROW(bytes_per_rank({1, 2}, {0}, 2), c10::ValueError);
  EXPECT_THROW(bytes_per_rank({1}, {2}, 2), c10::ValueError);
}

std::string refusal(int stage, const std::string& model_type, const std::string& optimizer, int world_size) {
  try {
    check_zero_run(stage, model_type, optimizer, world_size);
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.option(), "deepspeed_config");
    return e.message();
  }
  return "";
}

TEST(ZeroRefusals, NameDeepspeedConfig) {
  EXPECT_EQ(refusal(1, "full", "torch-adamw", 2), "");
  EXPECT_EQ(refusal(1, "full", "optimi-lion", 0), "");  // world size not known yet: validation
  EXPECT_EQ(refusal(0, "lora", "adamw_bf16", 1), "");   // no ZeRO: nothing to refuse
  EXPECT_NE(refusal(1, "lora", "torch-adamw", 2).find("needs model_type full, got 'lora'"), std::string::npos);
  EXPECT_NE(refusal(1, "full", "torch-adamw", 1).find("this run has 1 process"), std::string::npos);
  EXPECT_NE(refusal(1, "full", "adamw_bf16", 2).find("needs optimizer torch-adamw or optimi-lion"),
            std::string::npos);
  EXPECT_NE(refusal(2, "full", "torch-adamw", 2).find("remat implements stage 1 only"), std::string::npos);
}

std::string stage_error(const std::string& value) {
  try {
    zero_stage_of(value);
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.option(), "deepspeed_config");
    return e.message();
  }
  return "(accepted)";
}

TEST(DeepspeedConfig, ThreeFormsAndTheStage) {
  EXPECT_EQ(zero_stage_of("zero1"), 1);
  EXPECT_EQ(zero_stage_of(""), 0);
  EXPECT_EQ(zero_stage_of("None"), 0);
  std::vector<std::string> warnings;
  EXPECT_EQ(zero_stage_of(R"({"zero_optimization": {"stage": 1, "overlap_comm": true}, "train_batch_size": "auto"})",
                          &warnings),
            1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("ignoring train_batch_size, zero_optimization.overlap_comm"), std::string::npos) << warnings[0];
  EXPECT_EQ(zero_stage_of(R"({"zero_stage": 1})"), 1);
  EXPECT_EQ(zero_stage_of(R"(  {"zero_optimization": {"stage": 0}} )"), 0);

  testing::TempDir dir("deepspeed_config");
  const std::string path = dir / "ds.json";
  std::ofstream(path) << R"({"zero_optimization": {"stage": 1}})";
  EXPECT_EQ(zero_stage_of(path), 1);

  for (const char* value : {"zero2", "zero3", R"({"zero_optimization": {"stage": 2}})", R"({"zero_stage": 3})"}) {
    EXPECT_NE(stage_error(value).find("remat implements stage 1 only"), std::string::npos) << value;
  }
  EXPECT_NE(stage_error(R"({"zero_optimization": {}})").find("sets no zero_optimization.stage"), std::string::npos);
  EXPECT_NE(stage_error(R"({"zero_optimization": {"stage": "1"}})").find("must be an integer"), std::string::npos);
  EXPECT_NE(stage_error(R"({"zero_optimization": )").find("is not valid JSON"), std::string::npos);
  EXPECT_NE(stage_error("[1]").find("must be zero1, DeepSpeed JSON text"), std::string::npos);
  EXPECT_NE(stage_error(dir / "missing.json").find("must be zero1, DeepSpeed JSON text"), std::string::npos);
}

std::vector<Diagnostic> errors_on(const OptionValues& values, const std::string& option) {
  std::vector<Diagnostic> out;
  for (const auto& d : validate_option_values(values, Environment(false)).errors()) {
    if (d.option == option) out.push_back(d);
  }
  return out;
}

TEST(DeepspeedConfig, ValidatedWithTheRun) {
  const auto ok = validate_option_values({{"deepspeed_config", "zero1"}, {"optimizer", "torch-adamw"}},
                                         Environment(false));
  EXPECT_TRUE(errors_on({{"deepspeed_config", "zero1"}, {"optimizer", "torch-adamw"}}, "deepspeed_config").empty());
  EXPECT_EQ(ok.config.zero_stage, 1);
  EXPECT_EQ(validate_option_values({}, Environment(false)).config.zero_stage, 0);

  const auto lora = errors_on({{"deepspeed_config", "zero1"}, {"optimizer", "torch-adamw"}, {"model_type", "lora"}},
                              "deepspeed_config");
  ASSERT_EQ(lora.size(), 1u);
  EXPECT_NE(lora[0].message.find("needs model_type full"), std::string::npos) << lora[0].message;
  const auto stage3 = errors_on({{"deepspeed_config", "zero3"}, {"optimizer", "torch-adamw"}}, "deepspeed_config");
  ASSERT_EQ(stage3.size(), 1u);
  EXPECT_NE(stage3[0].message.find("stage 1 only"), std::string::npos);
  // SimpleTuner's default optimizer is refused with ZeRO-1, by name.
  const auto bf16 = errors_on({{"deepspeed_config", "zero1"}}, "deepspeed_config");
  ASSERT_EQ(bf16.size(), 1u);
  EXPECT_NE(bf16[0].message.find("adamw_bf16"), std::string::npos);
}

// Per rank: the fullest shard of the greedy assignment over the family's tensors, recomputed here
// from Flux's Linear layers.
TEST(ZeroMemoryModel, PerRankOptimizerStateIsTheLargestShard) {
  TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = "flux-dev";
  ModelUse use;
  use.training = true;
  const auto single = predict_rank_memory(spec, use, 1, 0);
  ASSERT_TRUE(single.has_value());
  EXPECT_EQ(single->optimizer_bytes, single->trainable * 8);
  EXPECT_EQ(predict_rank_memory(spec, use, 1, 1)->optimizer_bytes, single->optimizer_bytes);  // one process: nothing to shard
  EXPECT_EQ(predict_rank_memory(spec, use, 4, 0)->total(), single->total());  // plain data parallel: all of it per rank

  const ModelFamily& flux = model_family("flux");
  std::vector<int64_t> sizes;
  int64_t linear = 0;
  for (const auto& l : flux.linear_layers(spec)) {
    sizes.push_back(l.in_features * l.out_features);
    linear += sizes.back();
  }
  sizes.push_back(flux.parameter_count(spec) - linear);
  for (int world_size : {2, 4, 8}) {
    const auto d = predict_rank_memory(spec, use, world_size, 1);
    ASSERT_TRUE(d.has_value());
    const auto load = bytes_per_rank(sizes, assign_to_ranks(sizes, world_size), world_size);
    EXPECT_EQ(d->optimizer_bytes, *std::max_element(load.begin(), load.end()) * 8);
    EXPECT_GE(d->optimizer_bytes, single->optimizer_bytes / world_size);
    EXPECT_LT(d->optimizer_bytes, single->optimizer_bytes / world_size * 102 / 100);
    EXPECT_EQ(d->optimizer_shards, world_size);
    EXPECT_EQ(d->weight_bytes, single->weight_bytes);
    EXPECT_EQ(d->gradient_bytes, single->gradient_bytes);
    EXPECT_EQ(d->total(), single->total() - single->optimizer_bytes + d->optimizer_bytes + d->broadcast_bytes);
    // The figures docs/ZERO.md quotes.
    std::printf("[zero] flux-dev full fine-tune, %d processes, per process: weights %s, gradients %s, AdamW state "
                "%s -> %s with ZeRO-1 (+ broadcast %s); total %s -> %s\n",
                world_size, memory::format_bytes(d->weight_bytes).c_str(), memory::format_bytes(d->gradient_bytes).c_str(),
                memory::format_bytes(single->optimizer_bytes).c_str(), memory::format_bytes(d->optimizer_bytes).c_str(),
                memory::format_bytes(d->broadcast_bytes).c_str(), memory::format_bytes(single->total()).c_str(),
                memory::format_bytes(d->total()).c_str());
  }
  use.lora_rank = 16;
  use.lora_target = model_family("flux").lora_target_presets.front();
  const auto lora = predict_rank_memory(spec, use, 4, 1);
  EXPECT_EQ(lora->optimizer_shards, 1);  // ZeRO-1 is for full fine-tunes
  EXPECT_EQ(lora->optimizer_bytes, lora->trainable * 8);
}

TEST(ZeroMemoryModel, RealTensorsShardAndBroadcastBuffer) {
  std::vector<at::Tensor> params = {torch::zeros({1000}), torch::zeros({10}), torch::zeros({10}), torch::zeros({500})};
  const auto settings = OptimizerSettings::defaults_of("torch-adamw", 1e-3);
  EXPECT_EQ(zero_state_bytes_per_rank(settings, params, 1), optimizer_state_bytes(settings, params));
  // Rank 0 owns the 1000, rank 1 the rest (10 + 10 + 500 elements): the largest shard is rank 0's.
  EXPECT_EQ(zero_state_bytes_per_rank(settings, params, 2), 2 * 1000 * 4);
  // A 2 KiB bucket: rank 0's 4000-byte tensor goes in place; rank 1 packs 40 + 40 bytes, then its
  // 2000 bytes do not fit that bucket and open a second one.
  EXPECT_EQ(zero_broadcast_buffer_bytes(params, 2, 2048), 2000);
  // A 1 MiB bucket: rank 0 packs its 4000 bytes, rank 1 its 2080.
  EXPECT_EQ(zero_broadcast_buffer_bytes(params, 2, 1 << 20), 4000);
}

// `remat bench --world_size 2` on flux-tiny: the per-process prediction with and without ZeRO-1.
TEST(ZeroMemoryModel, BenchPredictsPerProcessWithAndWithoutZero) {
  BenchmarkOptions o;
  o.model.family = "flux";
  o.model.flavour = "flux-tiny";
  o.image_tokens = 16;
  o.text_tokens = 8;
  o.layouts = {"off"};
  o.steps = 1;
  o.warmup = 0;
  o.world_size = 2;
  const BenchmarkReport report = run_benchmark(o);
  ASSERT_TRUE(report.data_parallel.has_value());
  const DataParallelPrediction& d = *report.data_parallel;
  EXPECT_EQ(d.world_size, 2);
  EXPECT_EQ(d.optimizer_bytes, 2 * d.gradient_bytes);  // the benchmark's torch-adamw: two fp32 moments
  EXPECT_GE(d.zero_optimizer_bytes, d.optimizer_bytes / 2);  // the largest of two shards
  EXPECT_LT(d.zero_optimizer_bytes, d.optimizer_bytes);
  EXPECT_GT(d.saving_bytes(), 0);
  EXPECT_LE(d.saving_bytes(), d.optimizer_bytes - d.zero_optimizer_bytes);
  bool reported = false;
  for (const auto& [key, value] : report.facts) {
    if (key != "per process, 2 processes (predicted)") continue;
    reported = true;
    std::printf("[zero] remat bench --world_size 2, flux-tiny: %s\n", value.c_str());
    EXPECT_NE(value.find("saving " + memory::format_bytes(d.saving_bytes())), std::string::npos) << value;
  }
  EXPECT_TRUE(reported);
  o.world_size = 1;
  EXPECT_FALSE(run_benchmark(o).data_parallel.has_value());
}

}  // namespace zero_optimizer_test
}  // namespace
}  // namespace remat::train
