// Flux gradient checkpointing: every mode gives the outputs and gradients (all parameters and
// inputs) of the uncheckpointed run, while keeping fewer bytes alive between forward and backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/model_test_util.h"
#include "remat/models/flux.h"
#include "remat/models/lora.h"

namespace remat::models {
namespace {
namespace flux_checkpointing_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using test::close;
using test::RunResult;

struct Mode {
  Mode(std::string label_in, std::string backend_in, std::optional<int64_t> interval_in = std::nullopt,
       std::optional<int64_t> stride_in = std::nullopt, bool explicit_layout_in = false)
      : label(std::move(label_in)), backend(std::move(backend_in)), interval(interval_in),
        stride(stride_in), explicit_layout(explicit_layout_in) {}
  std::string label;
  std::string backend;
  std::optional<int64_t> interval;
  std::optional<int64_t> stride;
  bool explicit_layout;
};

class FluxCheckpointingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(0);
    config_ = FluxConfig::preset("flux-tiny");
    // 5 and 4 blocks: intervals 2 and 3 divide neither stack.
    config_.num_layers = 5;
    config_.num_single_layers = 4;
    model_ = Flux(config_);
    model_->to(torch::kFloat64);
    {
      // Move the RMSNorm weights off 1 so their gradients are not special.
      torch::NoGradGuard g;
      for (auto& item : model_->named_parameters()) {
        if (item.key().find("norm_") != std::string::npos) item.value().add_(torch::randn_like(item.value()) * 0.1);
      }
    }
    model_->train();
    const int64_t B = 2;
    inputs_ = {torch::randn({B, 16, 64}, torch::kFloat64), torch::randn({B, 8, 32}, torch::kFloat64),
               torch::randn({B, 16}, torch::kFloat64)};
    timestep_ = torch::tensor({0.3, 0.8}, torch::kFloat64);
    guidance_ = torch::tensor({3.5, 4.0}, torch::kFloat64);
    img_ids_ = flux_image_ids(4, 4);
    txt_ids_ = flux_text_ids(8);
    loss_weight_ = torch::randn({B, 16, 64}, torch::kFloat64);
  }

  // inputs: hidden, encoder, pooled, then `num_cn_double` double-stack residuals, then single ones.
  RunResult run(const std::vector<at::Tensor>& inputs, size_t num_cn_double = 0) {
    return test::run_with_grads(
        *model_, inputs,
        [&](const std::vector<at::Tensor>& in) {
          std::vector<at::Tensor> cn_double(in.begin() + 3, in.begin() + 3 + num_cn_double);
          std::vector<at::Tensor> cn_single(in.begin() + 3 + num_cn_double, in.end());
          return model_->forward(in[0], in[1], in[2], timestep_, img_ids_, txt_ids_, guidance_,
                                 cn_double, cn_single);
        },
        loss_weight_);
  }

  void configure(const Mode& mode) {
    if (mode.explicit_layout) {
      Layout doubles{{{0, 2, BlockMode::Recompute}, {2, 3, BlockMode::Keep}, {3, 5, BlockMode::Offload}}};
      Layout singles{{{0, 1, BlockMode::Keep}, {1, 4, BlockMode::Recompute}}};
      model_->set_checkpoint_plan(CheckpointPlan::from_layouts({doubles, singles}));
      return;
    }
    model_->set_checkpoint_plan(CheckpointPlan::simpletuner(true, mode.interval, mode.stride, mode.backend));
  }

  static std::vector<Mode> modes() {
    return {{"per-block", "torch"},
            {"interval 2", "torch", 2},
            {"interval 3", "torch", 3},
            {"interval 2 stride 3", "torch", 2, 3},
            {"torch-ffn", "torch-ffn"},
            {"torch-ffn interval 2", "torch-ffn", 2},
            {"unsloth", "unsloth"},
            {"unsloth interval 2", "unsloth", 2},
            {"unsloth-ffn", "unsloth-ffn"},
            {"explicit layout", "torch", std::nullopt, std::nullopt, true}};
  }

  FluxConfig config_;
  Flux model_{nullptr};
  std::vector<at::Tensor> inputs_;
  at::Tensor timestep_, guidance_, img_ids_, txt_ids_, loss_weight_;
};

constexpr double kRtol = 1e-9, kAtol = 1e-11;

TEST_F(FluxCheckpointingTest, EveryModeMatchesNoCheckpointingFullFineTune) {
  model_->set_checkpoint_plan(CheckpointPlan::off());
  const RunResult off = run(inputs_);
  // Full fine-tune: temb comes from trainable embedders and is captured by every block.
  ASSERT_TRUE(off.param_grads.at("time_text_embed.timestep_embedder.linear_1.weight").defined());
  for (const auto& mode : modes()) {
    SCOPED_TRACE(mode.label);
    configure(mode);
    const RunResult got = run(inputs_);
    const int compared = test::expect_same_run(got, off, kRtol, kAtol, mode.label);
    EXPECT_EQ(compared, static_cast<int>(off.param_grads.size() + inputs_.size()));
    EXPECT_LT(got.retained_bytes, off.retained_bytes)
        << mode.label << " kept " << got.retained_bytes << " bytes, plain run " << off.retained_bytes;
  }
}

TEST_F(FluxCheckpointingTest, OnlyActiveWhenTrainingAndEnabled) {
  model_->set_checkpoint_plan(CheckpointPlan::off());
  const RunResult off = run(inputs_);
  configure({"interval 2", "torch", 2});
  model_->eval();
  const RunResult eval = run(inputs_);
  EXPECT_TRUE(close(eval.output, off.output, kRtol, kAtol));
  // Eval mode runs the plain path even with checkpointing enabled.
  EXPECT_EQ(eval.retained_bytes, off.retained_bytes);
  model_->train();
  model_->set_checkpoint_plan(CheckpointPlan::off());
  EXPECT_EQ(run(inputs_).retained_bytes, off.retained_bytes);
  {
    torch::NoGradGuard no_grad;
    configure({"interval 2", "torch", 2});
    const auto out = model_->forward(inputs_[0], inputs_[1], inputs_[2], timestep_, img_ids_,
                                     txt_ids_, guidance_);
    EXPECT_TRUE(close(out, off.output, kRtol, kAtol));
  }
}

TEST_F(FluxCheckpointingTest, ControlNetResidualsWithSegments) {
  auto inputs = inputs_;
  for (int i = 0; i < 2; ++i) inputs.push_back(torch::randn({2, 16, 64}, torch::kFloat64));  // double
  for (int i = 0; i < 3; ++i) inputs.push_back(torch::randn({2, 16, 64}, torch::kFloat64));  // single
  model_->set_checkpoint_plan(CheckpointPlan::off());
  const RunResult plain = run(inputs_);
  const RunResult off = run(inputs, 2);
  EXPECT_FALSE(close(off.output, plain.output, 1e-3, 1e-3)) << "residuals had no effect";
  for (const auto& mode : {Mode{"interval 2", "torch", 2}, Mode{"per-block", "torch"},
                           Mode{"torch-ffn", "torch-ffn"}}) {
    configure(mode);
    const RunResult got = run(inputs, 2);
    test::expect_same_run(got, off, kRtol, kAtol, "controlnet " + mode.label);
    EXPECT_LT(got.retained_bytes, off.retained_bytes) << mode.label;
  }
  // diffusers' index mapping samples[k / ceil(num_blocks / len)]: 5 double blocks with 2 samples
  // use both (blocks 0-2 and 3-4); 4 single blocks with 3 samples use samples 0 and 1 only
  // (ceil(4 / 3) = 2, so blocks 2-3 take sample 1) and sample 2 gets no gradient.
  for (size_t i = 3; i < 8; ++i) {
    const bool used = i != 7;
    ASSERT_EQ(off.input_grads[i].defined(), used) << "residual " << i;
    if (used) {
      EXPECT_GT(off.input_grads[i].abs().sum().item<double>(), 0.0) << "residual " << i;
    }
  }
}

TEST_F(FluxCheckpointingTest, LoraModesMatchNoCheckpointing) {
  const auto names = apply_lora(*model_, flux_lora_target_modules("ai-toolkit"), 4, 8.0);
  ASSERT_FALSE(names.empty());
  {
    torch::NoGradGuard g;
    for (auto& p : lora_parameters(*model_)) p.copy_(torch::randn_like(p) * 0.1);
  }
  model_->set_checkpoint_plan(CheckpointPlan::off());
  const RunResult off = run(inputs_);
  for (const auto& mode : {Mode{"interval 2", "torch", 2}, Mode{"unsloth-ffn", "unsloth-ffn"},
                           Mode{"interval 2 stride 3", "torch", 2, 3}}) {
    configure(mode);
    const RunResult got = run(inputs_);
    test::expect_same_run(got, off, kRtol, kAtol, "lora " + mode.label);
    EXPECT_LT(got.retained_bytes, off.retained_bytes) << mode.label;
  }
  int with_grad = 0;
  for (const auto& [name, grad] : off.param_grads) {
    const bool is_lora = name.find(".lora_") != std::string::npos;
    EXPECT_EQ(grad.defined(), is_lora) << name;
    with_grad += grad.defined() ? 1 : 0;
  }
  EXPECT_EQ(with_grad, static_cast<int>(2 * names.size()));
}

TEST_F(FluxCheckpointingTest, LayoutFromSettings) {
  configure({"interval 2 stride 3", "torch", 2, 3});
  const auto& gc = model_->checkpoint_plan();
  EXPECT_EQ(describe_layout(gc.layout_for(0, 5)), "recompute[0-1] keep[2] recompute[3-4]");
  configure({"unsloth", "unsloth", 3});
  EXPECT_EQ(describe_layout(gc.layout_for(1, 4)), "offload[0-2] offload[3]");
  configure({"per-block", "torch", std::nullopt, 3});  // stride ignored without an interval > 1
  EXPECT_EQ(describe_layout(gc.layout_for(1, 2)), "recompute[0] recompute[1]");
  EXPECT_THROW(configure({"bad stride", "torch", 3, 2}), c10::ValueError);
}

}  // namespace flux_checkpointing_test
}  // namespace
}  // namespace remat::models
