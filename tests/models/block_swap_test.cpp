// Block swap on Flux (musubi_blocks_to_swap): a LoRA training step with the last blocks' frozen
// weights streamed from host memory gives bitwise the outputs and gradients of the same run with
// the weights on the device (the same checkpoint layout: streamed blocks that the plan keeps are
// recomputed), and those of the plain run within rounding; the tracked (device) bytes drop by the
// streamed weights less the ring.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/model_test_util.h"
#include "remat/memory.h"
#include "remat/models/block_swap.h"
#include "remat/models/flux.h"
#include "remat/models/mageflow.h"
#include "remat/models/lora.h"
#include "value_error.h"

namespace remat::models {
namespace {
namespace block_swap_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using test::RunResult;

TEST(BlockSwapLayoutTest, KeptBlocksInTheRangeBecomeCheckpointsOfTheirOwn) {
  const Layout layout{{{0, 3, BlockMode::Keep}, {3, 5, BlockMode::Recompute}, {5, 8, BlockMode::Keep}}};
  const Layout got = checkpoint_kept_blocks(layout, 2, 7);
  const Layout want{{{0, 2, BlockMode::Keep},
                     {2, 3, BlockMode::Recompute},
                     {3, 5, BlockMode::Recompute},
                     {5, 6, BlockMode::Recompute},
                     {6, 7, BlockMode::Recompute},
                     {7, 8, BlockMode::Keep}}};
  EXPECT_EQ(describe_layout(got), describe_layout(want));
  EXPECT_TRUE(got == want);
  EXPECT_TRUE(checkpoint_kept_blocks(layout, 8, 8) == layout);
}

TEST(BlockSwapLayoutTest, TheCountIsClampedAsSimpleTunerDoes) {
  bool clamped = true;
  EXPECT_EQ(clamp_blocks_to_swap(3, 57, &clamped), 3);
  EXPECT_FALSE(clamped);
  EXPECT_EQ(clamp_blocks_to_swap(80, 57, &clamped), 56);
  EXPECT_TRUE(clamped);
  EXPECT_EQ(clamp_blocks_to_swap(0, 57), 0);
  EXPECT_NE(testing::error_of([] { clamp_blocks_to_swap(-1, 57); }).find("musubi_blocks_to_swap must be >= 0"),
            std::string::npos);
}

class FluxBlockSwapTest : public ::testing::Test {
 protected:
  RunResult run() { return flux_.run(); }

  // The stacks' layouts a plan runs, with the blocks from global index `first` on that it keeps
  // made checkpoints of their own: what the model runs when those blocks are streamed.
  std::vector<Layout> effective_layouts(const CheckpointPlan& plan, int64_t first) const {
    std::vector<Layout> layouts;
    const std::vector<int64_t> sizes{config_.num_layers, config_.num_single_layers};
    int64_t begin = 0;
    for (size_t s = 0; s < 2; ++s) {
      Layout layout = plan.enabled ? plan.layout_for(s, sizes[s]) : layout_keep_all(sizes[s]);
      layouts.push_back(checkpoint_kept_blocks(layout, std::max<int64_t>(first - begin, 0), sizes[s]));
      begin += sizes[s];
    }
    return layouts;
  }

  test::TinyFlux flux_;
  FluxConfig& config_ = flux_.config;
  Flux& model_ = flux_.model;
};

TEST_F(FluxBlockSwapTest, StreamedTrainingStepsMatchTheWeightsOnTheDevice) {
  const RunResult plain = run();
  const std::vector<std::pair<std::string, CheckpointPlan>> plans = {
      {"off", CheckpointPlan::off()},
      {"interval 2", CheckpointPlan::simpletuner(true, 2, std::nullopt, "torch")},
      {"per block, unsloth", CheckpointPlan::simpletuner(true, std::nullopt, std::nullopt, "unsloth")},
      {"interval 2 stride 3", CheckpointPlan::simpletuner(true, 2, 3, "torch")},
  };
  for (const auto& [plan_name, plan] : plans) {
    for (int64_t swap : {1, 4, 6}) {
      const std::string label = plan_name + ", " + std::to_string(swap) + " blocks swapped";
      const int64_t first = 7 - swap;
      // The same layout with every weight on the device.
      model_->set_block_swap(0);
      model_->set_checkpoint_plan(CheckpointPlan::from_layouts(effective_layouts(plan, first)));
      const RunResult on_device = run();
      // Streamed.
      model_->set_checkpoint_plan(plan);
      EXPECT_EQ(model_->set_block_swap(swap), swap);
      const RunResult streamed = run();
      ASSERT_NE(model_->block_swap(), nullptr);
      EXPECT_GT(model_->block_swap()->stats().copies, 0) << label;
      test::expect_bitwise_run(streamed, on_device, label);
      test::expect_same_run(streamed, plain, 1e-10, 1e-12, label + " against the plain run");
      // A second step on the same stream (the ring already holds the first segment).
      test::expect_bitwise_run(run(), on_device, label + ", second step");
    }
  }
  model_->set_block_swap(0);
  model_->set_checkpoint_plan(CheckpointPlan::off());
  test::expect_bitwise_run(run(), plain, "swap turned off");
}

// A full fine-tune streams trained weights both ways: the same gradients as the same layout with
// every weight on the device, and after finish_backward each streamed weight's gradient is on its
// host copy (moved there once per backward), where the optimizer finds it.
TEST_F(FluxBlockSwapTest, FullFineTuneStreamsWeightsAndGradientsBothWays) {
  torch::manual_seed(0);
  model_ = Flux(config_);
  model_->to(torch::kFloat64);
  model_->train();
  const std::vector<std::pair<std::string, CheckpointPlan>> plans = {
      {"interval 2", CheckpointPlan::simpletuner(true, 2, std::nullopt, "torch")},
      {"per block", CheckpointPlan::simpletuner(true, std::nullopt, std::nullopt, "torch")},
  };
  for (const auto& [plan_name, plan] : plans) {
    for (int64_t swap : {1, 4, 6}) {
      const std::string label = plan_name + ", " + std::to_string(swap) + " blocks swapped";
      const int64_t first = 7 - swap;
      model_->set_block_swap(0);
      model_->set_checkpoint_plan(CheckpointPlan::from_layouts(effective_layouts(plan, first)));
      const RunResult on_device = run();
      model_->set_checkpoint_plan(plan);
      EXPECT_EQ(model_->set_block_swap(swap), swap);
      const RunResult streamed = run();
      const WeightStreamStats before = model_->block_swap()->stats();
      ASSERT_TRUE(model_->block_swap()->trains_weights()) << label;
      model_->block_swap()->finish_backward();
      test::expect_bitwise_run(streamed, on_device, label);
      // Every streamed weight's gradient crossed to the host exactly once.
      int64_t streamed_bytes = 0;
      for (int64_t b = first; b < 7; ++b) {
        const std::shared_ptr<torch::nn::Module> block =
            b < config_.num_layers
                ? std::shared_ptr<torch::nn::Module>(model_->transformer_blocks[b].ptr())
                : std::shared_ptr<torch::nn::Module>(model_->single_transformer_blocks[b - config_.num_layers].ptr());
        for (const auto& p : block->parameters()) streamed_bytes += p.numel() * static_cast<int64_t>(p.element_size());
      }
      const WeightStreamStats after = model_->block_swap()->stats();
      EXPECT_EQ(after.gradient_bytes_returned, streamed_bytes) << label;
      EXPECT_LT(before.gradient_bytes_returned, streamed_bytes) << label << ": the first group waits for finish_backward";
      for (const auto& item : model_->named_parameters()) {
        EXPECT_TRUE(torch::equal(item.value().grad(), on_device.param_grads.at(item.key())))
            << label << ": gradient of " << item.key() << " after finish_backward";
      }
    }
  }
  model_->set_block_swap(0);
}

TEST_F(FluxBlockSwapTest, FeedForwardScopeAndInferenceStayExact) {
  const RunResult plain = run();
  model_->set_checkpoint_plan(CheckpointPlan::simpletuner(true, 1, std::nullopt, "torch-ffn"));
  model_->set_block_swap(3);
  test::expect_same_run(run(), plain, 1e-10, 1e-12, "torch-ffn with 3 blocks swapped");

  model_->set_block_swap(0);
  model_->eval();
  torch::NoGradGuard no_grad;
  const auto forward = [&] {
    return flux_.forward(flux_.inputs);
  };
  const at::Tensor want = forward();
  model_->set_block_swap(6);
  EXPECT_TRUE(torch::equal(forward(), want)) << "inference with 6 blocks swapped";
  // Inference runs each block as its own group: the ring stays at two slots.
  EXPECT_EQ(model_->block_swap()->stats().ring_slots, 2);
}

TEST_F(FluxBlockSwapTest, TrackedBytesDropByTheStreamedWeightsLessTheRing) {
  int64_t streamed_bytes = 0;
  const int64_t before = memory::current_bytes();
  for (const auto& block : model_->single_transformer_blocks) {
    for (const auto& p : block->parameters()) {
      if (!p.requires_grad()) streamed_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    }
  }
  model_->set_block_swap(4);  // the four single blocks
  const WeightStreamStats s = model_->block_swap()->stats();
  EXPECT_EQ(s.host_bytes, streamed_bytes);
  EXPECT_EQ(memory::current_bytes() - before, s.device_bytes - streamed_bytes);
  EXPECT_LT(s.device_bytes, streamed_bytes);
}

// MageFlow: one stack; packed samples. Same check as Flux's, on interval 2 and on no checkpointing.
TEST(MageFlowBlockSwapTest, StreamedTrainingStepsMatchTheWeightsOnTheDevice) {
  test::TinyMageFlowLoRA step;
  MageFlow& model = step.model;
  for (const auto& plan : {CheckpointPlan::off(), CheckpointPlan::simpletuner(true, 2, std::nullopt, "torch")}) {
    const int64_t swap = 3, first = 5 - swap;
    const Layout base = plan.enabled ? plan.layout_for(0, 5) : layout_keep_all(5);
    model->set_block_swap(0);
    model->set_checkpoint_plan(CheckpointPlan::from_layouts({checkpoint_kept_blocks(base, first, 5)}));
    const RunResult on_device = step.run();
    model->set_checkpoint_plan(plan);
    EXPECT_EQ(model->set_block_swap(swap), swap);
    test::expect_bitwise_run(step.run(), on_device, plan.enabled ? "mageflow, interval 2" : "mageflow, no checkpointing");
  }
  // Training with skip_layers and block swap is refused by name; inference with them runs.
  EXPECT_NE(testing::error_of([&] {
              model->forward(step.inputs[0], step.inputs[1], step.timesteps, step.shapes, step.img_cu, step.txt_cu, {4});
            }).find("block swap with skip_layers needs no autograd recording"),
            std::string::npos);
}

}  // namespace block_swap_test
}  // namespace
}  // namespace remat::models
