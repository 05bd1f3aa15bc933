// Attention offload on Flux and MageFlow (gradient_checkpointing_offload_attention): a training
// step whose blocks keep their attention activations in host memory gives bitwise the outputs
// and gradients of the same step without it, under every checkpoint plan, with block swap, with
// prefetch and with a capped buffer pool, LoRA or full; the tracked (device) bytes a kept block
// holds until backward drop; inference and evaluation offload nothing.
#include <gtest/gtest.h>
#include <torch/torch.h>

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

void expect_bitwise(const RunResult& got, const RunResult& want, const std::string& label) {
  EXPECT_TRUE(torch::equal(got.output, want.output)) << label << ": output";
  int compared = 0;
  for (const auto& [name, grad] : want.param_grads) {
    const at::Tensor& g = got.param_grads.at(name);
    ASSERT_EQ(g.defined(), grad.defined()) << label << ": " << name;
    if (!grad.defined()) continue;
    EXPECT_TRUE(torch::equal(g, grad)) << label << ": gradient of " << name;
    ++compared;
  }
  for (size_t i = 0; i < want.input_grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(got.input_grads[i], want.input_grads[i])) << label << ": input gradient " << i;
  }
  EXPECT_GT(compared, 0) << label;
}

class FluxAttentionOffloadTest : public ::testing::Test {
 protected:
  void build(bool lora) {
    torch::manual_seed(0);
    config_ = FluxConfig::preset("flux-tiny");
    config_.num_layers = 3;
    config_.num_single_layers = 4;
    model_ = Flux(config_);
    model_->to(torch::kFloat64);
    if (lora) {
      apply_lora(*model_, flux_lora_target_modules("all+ffs"), 4, 4.0);
      torch::NoGradGuard g;  // LoRA B starts at zero: give it values so its gradients are not special
      for (auto& p : lora_parameters(*model_)) p.normal_(0.0, 0.1);
    }
    model_->train();
    const int64_t B = 2;
    inputs_ = {torch::randn({B, 16, 64}, torch::kFloat64), torch::randn({B, 8, 32}, torch::kFloat64),
               torch::randn({B, 16}, torch::kFloat64)};
    timestep_ = torch::tensor({0.3, 0.8}, torch::kFloat64);
    guidance_ = torch::tensor({3.5, 4.0}, torch::kFloat64);
    loss_weight_ = torch::randn({B, 16, 64}, torch::kFloat64);
  }

  RunResult run() {
    return test::run_with_grads(
        *model_, inputs_,
        [&](const std::vector<at::Tensor>& in) {
          return model_->forward(in[0], in[1], in[2], timestep_, flux_image_ids(4, 4), flux_text_ids(8), guidance_);
        },
        loss_weight_);
  }

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
          expect_bitwise(run(), without, label);
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

  FluxConfig config_;
  Flux model_{nullptr};
  std::vector<at::Tensor> inputs_;
  at::Tensor timestep_, guidance_, loss_weight_;
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
    at::Tensor out = model_->forward(inputs_[0], inputs_[1], inputs_[2], timestep_, flux_image_ids(4, 4),
                                     flux_text_ids(8), guidance_);
    const int64_t held = memory::current_bytes() - before;
    (out * loss_weight_).sum().backward();
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
  // Evaluation and inference offload nothing.
  reset_saved_tensor_offload_stats();
  model_->eval();
  held_after_forward();
  model_->train();
  {
    torch::NoGradGuard no_grad;
    model_->forward(inputs_[0], inputs_[1], inputs_[2], timestep_, flux_image_ids(4, 4), flux_text_ids(8), guidance_);
  }
  EXPECT_EQ(saved_tensor_offload_stats().tensors_offloaded, 0);
  model_->set_attention_offload(std::nullopt);
}

TEST(MageFlowAttentionOffloadTest, StepsAreBitwiseThoseWithoutIt) {
  torch::manual_seed(0);
  MageFlowConfig config = MageFlowConfig::preset("mageflow-tiny");
  config.depth = 5;
  MageFlow model(config);
  model->to(torch::kFloat64);
  apply_lora(*model, mageflow_lora_target_modules("default"), 4, 4.0);
  {
    torch::NoGradGuard g;
    for (auto& p : lora_parameters(*model)) p.normal_(0.0, 0.1);
  }
  model->train();
  const std::vector<ImageShape> shapes = {{1, 3, 4}, {1, 2, 2}, {1, 2, 3}};
  const std::vector<at::Tensor> inputs = {torch::randn({1, 22, 128}, torch::kFloat64),
                                          torch::randn({1, 9, 32}, torch::kFloat64)};
  const at::Tensor timesteps = torch::tensor({0.25, 0.75}, torch::kFloat64);
  const at::Tensor img_cu = torch::tensor({0, 12, 22}, torch::kInt32), txt_cu = torch::tensor({0, 5, 9}, torch::kInt32);
  const at::Tensor loss_weight = torch::randn({1, 22, 128}, torch::kFloat64);
  const auto run = [&] {
    return test::run_with_grads(
        *model, inputs, [&](const auto& in) { return model->forward(in[0], in[1], timesteps, shapes, img_cu, txt_cu); },
        loss_weight);
  };
  for (const auto& plan : {CheckpointPlan::off(), CheckpointPlan::simpletuner(true, 2, std::nullopt, "torch"),
                           CheckpointPlan::simpletuner(true, std::nullopt, std::nullopt, "unsloth-ffn")}) {
    for (int64_t swap : {0, 3}) {
      model->set_checkpoint_plan(plan);
      model->set_block_swap(swap);
      model->set_attention_offload(std::nullopt);
      const RunResult without = run();
      for (bool prefetch : {false, true}) {
        const std::string label = "mageflow, " + plan.backend_name() + (plan.enabled ? "" : " off") + ", swap " +
                                  std::to_string(swap) + (prefetch ? ", prefetch" : "");
        model->set_attention_offload(SavedTensorOffload{prefetch});
        reset_saved_tensor_offload_stats();
        expect_bitwise(run(), without, label);
        EXPECT_GT(saved_tensor_offload_stats().tensors_offloaded, 0) << label;
      }
    }
  }
  model->set_block_swap(0);
}

}  // namespace attention_offload_test
}  // namespace
}  // namespace remat::models
