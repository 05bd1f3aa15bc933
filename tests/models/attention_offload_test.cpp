// Attention offload on Flux and MageFlow (gradient_checkpointing_offload_attention): a training
// step whose blocks keep their attention activations in host memory gives bitwise the outputs
// and gradients of the same step without it, under every checkpoint plan, with block swap, with
// prefetch and with a capped buffer pool, LoRA or full; the tracked (device) bytes a kept block
// holds until backward drop; inference and evaluation offload nothing.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "models/model_test_util.h"
#include "remat/activation_offload.h"
#include "remat/memory.h"
#include "remat/models/flux.h"
#include "remat/models/lora.h"
#include "remat/models/mageflow.h"

namespace remat::models {
namespace {
namespace attention_offload_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using test::RunResult;

class FluxAttentionOffloadTest : public ::testing::Test {
 protected:
  void build(bool lora) {
    flux_.emplace(lora);
    model_ = flux_->model;
  }
  RunResult run() { return flux_->run(); }

  // Every plan, with and without block swap and prefetch: bitwise the step without the offload.
  void expect_every_mix_exact(const std::string& kind) {
    const std::vector<std::pair<std::string, CheckpointPlan>> plans = {
        {"no checkpointing", CheckpointPlan::off()},
        {"interval 2", CheckpointPlan::simpletuner(true, 2, std::nullopt, "torch")},
        {"per block, unsloth", CheckpointPlan::simpletuner(true, std::nullopt, std::nullopt, "unsloth")},
        {"interval 2 stride 3", CheckpointPlan::simpletuner(true, 2, 3, "torch")},
        {"torch-ffn", CheckpointPlan::simpletuner(true, std::nullopt, std::nullopt, "torch-ffn")},
    };
    set_offload_pin_memory_max_buckets(2);  // fewer buckets than the step's shapes
    for (const auto& [plan_name, plan] : plans) {
      for (int64_t swap : {0, 4}) {
        model_->set_checkpoint_plan(plan);
        model_->set_block_swap(swap);
        model_->set_attention_offload(std::nullopt);
        const RunResult without = run();
        for (bool prefetch : {false, true}) {
          const std::string label = kind + ", " + plan_name + ", " + std::to_string(swap) + " blocks swapped" +
                                    (prefetch ? ", prefetch" : "");
          model_->set_attention_offload(SavedTensorOffload{prefetch});
          reset_saved_tensor_offload_stats();
          test::expect_bitwise_run(run(), without, label);
          const SavedTensorOffloadStats s = saved_tensor_offload_stats();
          EXPECT_GT(s.tensors_offloaded, 0) << label;
          EXPECT_EQ(s.bytes_to_device, s.bytes_to_host) << label;
          // Recomputed blocks come back just in time; kept ones prefetch the kept one before.
          EXPECT_EQ(s.prefetched > 0, prefetch && plan_name != "per block, unsloth") << label;
        }
      }
    }
    model_->set_block_swap(0);
    model_->set_attention_offload(std::nullopt);
    set_offload_pin_memory_max_buckets(kDefaultOffloadPinMemoryMaxBuckets);
  }

  std::optional<test::TinyFlux> flux_;
  Flux model_{nullptr};
};

TEST_F(FluxAttentionOffloadTest, LoRAStepsAreBitwiseThoseWithoutIt) {
  build(/*lora=*/true);
  expect_every_mix_exact("LoRA");
}

TEST_F(FluxAttentionOffloadTest, FullFineTuneStepsAreBitwiseThoseWithoutIt) {
  build(/*lora=*/false);
  expect_every_mix_exact("full");
}

// Without checkpointing every block is kept: what the step holds at the end of forward drops by
// the attention activations, which went to the host.
TEST_F(FluxAttentionOffloadTest, KeptBlocksHoldLessUntilBackward) {
  build(/*lora=*/true);
  ASSERT_TRUE(memory::cpu_tracking_installed());
  model_->set_checkpoint_plan(CheckpointPlan::off());
  auto held_after_forward = [&] {
    const int64_t before = memory::current_bytes();
    at::Tensor out = flux_->forward(flux_->inputs);
    const int64_t held = memory::current_bytes() - before;
    (out * flux_->loss_weight).sum().backward();
    model_->zero_grad();
    return held;
  };
  const int64_t plain = held_after_forward();
  model_->set_attention_offload(SavedTensorOffload{});
  reset_saved_tensor_offload_stats();
  const int64_t offloaded = held_after_forward();
  const int64_t moved = saved_tensor_offload_stats().bytes_to_host;
  EXPECT_LT(offloaded, plain * 3 / 4) << "plain " << plain << " B, with attention offload " << offloaded << " B";
  EXPECT_GE(moved, plain - offloaded);
  std::printf("flux-tiny (3 + 4 blocks, float64, LoRA), no checkpointing: %lld bytes held after forward, %lld with "
              "the attention offload (%lld bytes to the host)\n",
              static_cast<long long>(plain), static_cast<long long>(offloaded), static_cast<long long>(moved));
  // Evaluation and inference offload nothing.
  reset_saved_tensor_offload_stats();
  model_->eval();
  held_after_forward();
  model_->train();
  {
    torch::NoGradGuard no_grad;
    flux_->forward(flux_->inputs);
  }
  EXPECT_EQ(saved_tensor_offload_stats().tensors_offloaded, 0);
  model_->set_attention_offload(std::nullopt);
}

TEST(MageFlowAttentionOffloadTest, StepsAreBitwiseThoseWithoutIt) {
  test::TinyMageFlowLoRA step;
  MageFlow& model = step.model;
  for (const auto& plan : {CheckpointPlan::off(), CheckpointPlan::simpletuner(true, 2, std::nullopt, "torch"),
                           CheckpointPlan::simpletuner(true, std::nullopt, std::nullopt, "unsloth-ffn")}) {
    for (int64_t swap : {0, 3}) {
      model->set_checkpoint_plan(plan);
      model->set_block_swap(swap);
      model->set_attention_offload(std::nullopt);
      const RunResult without = step.run();
      for (bool prefetch : {false, true}) {
        const std::string label = "mageflow, " + plan.backend_name() + (plan.enabled ? "" : " off") + ", swap " +
                                  std::to_string(swap) + (prefetch ? ", prefetch" : "");
        model->set_attention_offload(SavedTensorOffload{prefetch});
        reset_saved_tensor_offload_stats();
        test::expect_bitwise_run(step.run(), without, label);
        EXPECT_GT(saved_tensor_offload_stats().tensors_offloaded, 0) << label;
      }
    }
  }
  model->set_block_swap(0);
  model->set_attention_offload(std::nullopt);
}

}  // namespace attention_offload_test
}  // namespace
}  // namespace remat::models
