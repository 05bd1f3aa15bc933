// gradient_checkpointing_interval: auto on CPU with flux-tiny: the measured step model predicts
// the tracked peak, the chosen layout's measured peak stays within the budget, nothing-fits
// errors say what to do; plus the benchmark's layout names and sizes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adamw.h>

#include "remat/memory.h"
#include "remat/byte_size.h"
#include "remat/train/memory/auto_layout.h"
#include "remat/train/memory/benchmark.h"
#include "remat/train/run/step.h"
#include "remat/train/family/transformer.h"

namespace remat::train {
namespace {
namespace auto_layout_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

// A flux-tiny training setup: model (LoRA rank 4 or full), AdamW, a synthetic batch.
struct FluxTinyRun {
  std::unique_ptr<Transformer> model;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  Batch batch;
  at::Generator generator = at::detail::createCPUGenerator(7);
  StepSettings settings;

  explicit FluxTinyRun(bool lora) {
    torch::manual_seed(0);
    TransformerSpec spec;
    spec.family = "flux";
    spec.flavour = "flux-tiny";
    model = make_transformer(spec, at::Device(at::kCPU));
    if (lora) model->apply_lora("default", 4, 4.0);
    model->module().train();
    for (const auto& [name, p] : model->trainable_parameters()) params.push_back(p);
    optimizer = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-4));
    batch = model->synthetic_batch(1, 64, 16, generator, at::Device(at::kCPU));
  }

  void apply(const std::vector<Layout>& layouts) {
    model->set_checkpoint_plan(CheckpointPlan::from_layouts(layouts));
  }

  int64_t measured_peak() {
    int64_t peak = 0;
    for (int i = 0; i < 2; ++i) {
      peak = std::max(peak, run_training_step(*model, *optimizer, params, batch, settings, generator).peak_bytes);
    }
    return peak;
  }
};

void check_budgets(bool lora) {
  FluxTinyRun s(lora);
  s.apply({layout_from_interval(2, 1), layout_from_interval(2, 1)});
  s.measured_peak();  // optimizer state exists from here on, as in a run after its first step
  const StepModel step = profile_step(*s.model, *s.optimizer, s.params, s.batch, s.settings, s.generator);
  ASSERT_EQ(step.chain.num_blocks(), 4);
  ASSERT_EQ(step.chain.forced_boundaries, std::vector<int64_t>{2});
  const int64_t keep_all = predict(step.chain, layout_keep_all(4)).peak_bytes;
  const int64_t min_peak = plan_layout(step.chain, 1).min_possible_peak;
  ASSERT_LT(min_peak, keep_all);
  for (int64_t budget : {min_peak, min_peak + (keep_all - min_peak) / 2, keep_all}) {
    const AutoLayout chosen = plan_auto_layout(step, budget);
    s.apply(chosen.stack_layouts);
    const int64_t measured = s.measured_peak();
    const std::string where = std::string(lora ? "LoRA" : "full") + ", budget " + std::to_string(budget) +
                              ", layout " + describe_layout(chosen.plan.layout);
    EXPECT_LE(measured, budget) << where;
    const double error = std::abs(static_cast<double>(chosen.plan.prediction.peak_bytes - measured)) /
                         static_cast<double>(measured);
    EXPECT_LT(error, 0.05) << where << ": predicted " << chosen.plan.prediction.peak_bytes
                           << ", measured " << measured;
  }
}

TEST(AutoLayout, ChosenLayoutStaysWithinBudgetLora) { check_budgets(/*lora=*/true); }
TEST(AutoLayout, ChosenLayoutStaysWithinBudgetFullFineTune) { check_budgets(/*lora=*/false); }

TEST(AutoLayout, NothingFitsNamesTheSmallestPeak) {
  FluxTinyRun s(/*lora=*/true);
  const StepModel step = profile_step(*s.model, *s.optimizer, s.params, s.batch, s.settings, s.generator);
  const int64_t min_peak = plan_layout(step.chain, 1).min_possible_peak;
  // Before a first step the AdamW moments are missing: the model adds them.
  EXPECT_EQ(step.missing_optimizer_state_bytes, 2 * storage_bytes(s.params));
  try {
    plan_auto_layout(step, min_peak - 1);
    FAIL() << "expected nothing to fit below the smallest peak";
  } catch (const NoLayoutFits& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("gradient_checkpointing_memory_budget must be at least " + memory::format_bytes(min_peak)),
              std::string::npos) << text;
    EXPECT_NE(text.find("nothing fits"), std::string::npos) << text;
  }
}

TEST(AutoLayout, ProfileLeavesTheRunUnchanged) {
  FluxTinyRun s(/*lora=*/true);
  const at::Tensor before = s.params.front().detach().clone();
  const at::Tensor noise_state = s.generator.get_state();
  const at::Tensor cpu_state = at::detail::getDefaultCPUGenerator().get_state();
  profile_step(*s.model, *s.optimizer, s.params, s.batch, s.settings, s.generator);
  EXPECT_TRUE(torch::equal(before, s.params.front()));
  EXPECT_TRUE(torch::equal(noise_state, s.generator.get_state()));
  EXPECT_TRUE(torch::equal(cpu_state, at::detail::getDefaultCPUGenerator().get_state()));
  for (const auto& p : s.params) EXPECT_FALSE(p.grad().defined());
  EXPECT_TRUE(s.optimizer->state().empty());
}

TEST(AutoLayout, StackLayoutsSplitAndJoin) {
  const Layout joined = join_stack_layouts({layout_from_interval(2, 1), layout_keep_all(3)});
  EXPECT_EQ(describe_layout(joined), "recompute[0] recompute[1] keep[2-4]");
  const auto stacks = split_stack_layout(layout_keep_all(5), {2, 3});
  ASSERT_EQ(stacks.size(), 2u);
  EXPECT_EQ(stacks[0], layout_keep_all(2));
  EXPECT_EQ(stacks[1], layout_keep_all(3));
  Layout across;
  across.segments = {{0, 3, BlockMode::Recompute}, {3, 5, BlockMode::Keep}};
  EXPECT_THROW(split_stack_layout(across, {2, 3}), c10::ValueError);
}

TEST(BenchmarkLayouts, ParsesEveryForm) {
  const std::vector<int64_t> stacks{4, 8};
  EXPECT_EQ(parse_benchmark_layout("off", stacks).kind, BenchmarkLayout::Kind::Off);
  EXPECT_EQ(parse_benchmark_layout("ffn", stacks).kind, BenchmarkLayout::Kind::Ffn);
  EXPECT_EQ(parse_benchmark_layout("1", stacks).layout.num_checkpoints(), 12);
  // Interval 8 on a stack of 4: one checkpoint for that stack.
  EXPECT_EQ(parse_benchmark_layout("8", stacks).layout.num_checkpoints(), 2);
  const auto strided = parse_benchmark_layout("2/4", stacks);
  EXPECT_EQ(describe_layout(strided.layout),
            "recompute[0-1] keep[2-3] recompute[4-5] keep[6-7] recompute[8-9] keep[10-11]");
  const auto offload = parse_benchmark_layout("offload", stacks);
  EXPECT_EQ(offload.layout.block_modes(), std::vector<BlockMode>(12, BlockMode::Offload));
  const auto automatic = parse_benchmark_layout("auto:1.5GiB", stacks);
  EXPECT_EQ(automatic.kind, BenchmarkLayout::Kind::Auto);
  EXPECT_EQ(automatic.budget_bytes, 3LL << 29);
  EXPECT_EQ(remat::parse_byte_size("20MB"), 20000000);
  for (const char* bad : {"0", "2/1", "auto:", "auto:-3GiB", "auto:3XB", "every"}) {
    try {
      parse_benchmark_layout(bad, stacks);
      FAIL() << bad;
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("got '") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(BenchmarkLayouts, DefaultListHasTwoAutoBudgetsBetweenTheBounds) {
  const auto names = default_benchmark_layouts(false, 100LL << 20, 400LL << 20);
  const std::vector<std::string> expected{"off", "1", "2", "4", "8", "2/4", "ffn", "auto:200.0MiB", "auto:300.0MiB"};
  EXPECT_EQ(names, expected);
  const auto flat = default_benchmark_layouts(false, 100LL << 20, 100LL << 20);
  EXPECT_EQ(std::count(flat.begin(), flat.end(), "auto:100.0MiB"), 1);
  const auto cuda = default_benchmark_layouts(true, 100LL << 20, 400LL << 20);
  EXPECT_NE(std::find(cuda.begin(), cuda.end(), "offload"), cuda.end());
}

}  // namespace auto_layout_test
}  // namespace
}  // namespace remat::train
