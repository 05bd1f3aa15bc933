// `remat plan`'s memory model and planner (remat/train/memory/training_plan.h): the model extended
// from three narrow proxies against a direct profile of a wider Flux, and the plan's predicted
// peak against the tracked peak of real training steps run with the plan's layout and block swap.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include "remat/memory.h"
#include "remat/models/mageflow.h"
#include "remat/models/quantization.h"
#include "remat/train/family/family.h"
#include "remat/train/memory/admission.h"
#include "remat/train/memory/auto_layout.h"
#include "remat/train/memory/training_plan.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/run/step.h"

namespace remat::train {
namespace {
namespace training_plan_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

// A Flux eight heads wide (twice the widest proxy) with three blocks a stack (the proxies have two).
constexpr const char* kWideFlux =
    R"({"num_layers": 3, "num_single_layers": 3, "attention_head_dim": 16, "num_attention_heads": 8,
        "joint_attention_dim": 32, "pooled_projection_dim": 16, "in_channels": 64, "guidance_embeds": true,
        "axes_dims_rope": [4, 6, 6]})";

TrainingPlanRequest wide_request(int64_t lora_rank, const std::string& precision, bool bf16) {
  TrainingPlanRequest r;
  r.spec.family = "flux";
  r.spec.config_json = kWideFlux;
  r.spec.base_precision = models::parse_base_model_precision(precision);
  r.lora_rank = lora_rank;
  r.lora_target = lora_rank > 0 ? "all" : "";
  r.batch = 2;
  r.image_tokens = 64;
  r.text_tokens = 16;
  r.bf16 = bf16;
  r.device = c10::Device(c10::kCPU);
  r.budget_bytes = int64_t{1} << 40;
  return r;
}

// (predicted - measured) / measured.
double error_of(int64_t predicted, int64_t measured) {
  return static_cast<double>(predicted - measured) / static_cast<double>(std::max<int64_t>(1, measured));
}

double relative(int64_t a, int64_t b) {
  return std::abs(static_cast<double>(a - b)) / std::max<double>(1.0, static_cast<double>(std::max(std::abs(a), std::abs(b))));
}

// Every block's figures, extended from 1-4 heads, against the 8-head model's own profile; the
// predicted peaks of keep-all and per-block layouts likewise.
void expect_model_matches_direct_profile(const TrainingPlanRequest& request, const std::string& what) {
  const StepMemoryModel model = build_step_memory_model(request);
  const StepModel direct = profile_step_for_plan(request.spec, request);
  ASSERT_EQ(model.chain.num_blocks(), direct.chain.num_blocks()) << what;
  for (int64_t b = 0; b < model.chain.num_blocks(); ++b) {
    const BlockCost& m = model.chain.blocks[static_cast<size_t>(b)];
    const BlockCost& d = direct.chain.blocks[static_cast<size_t>(b)];
    const std::string where = what + ", block " + std::to_string(b);
    EXPECT_EQ(m.boundary_bytes, d.boundary_bytes) << where;
    EXPECT_EQ(m.output_bytes, d.output_bytes) << where;
    EXPECT_EQ(m.boundary_grad_bytes, d.boundary_grad_bytes) << where;
    EXPECT_EQ(m.retained_input_bytes, d.retained_input_bytes) << where;
    // What a block keeps is a polynomial in the width: extended exactly, up to the rounding of
    // the proxies' token counts.
    EXPECT_LT(relative(m.activation_bytes, d.activation_bytes), 0.01) << where << ": " << m.activation_bytes << " vs " << d.activation_bytes;
    // Its peaks are maxima over moments whose order can change with the width: within 2 % below
    // (a step's peak is mostly what is kept) and 12 % above (safe side).
    EXPECT_GT(error_of(m.forward_peak_bytes, d.forward_peak_bytes), -0.02) << where << ": " << m.forward_peak_bytes << " vs " << d.forward_peak_bytes;
    EXPECT_LT(error_of(m.forward_peak_bytes, d.forward_peak_bytes), 0.12) << where << ": " << m.forward_peak_bytes << " vs " << d.forward_peak_bytes;
    EXPECT_GT(error_of(m.backward_peak_bytes, d.backward_peak_bytes), -0.02) << where << ": " << m.backward_peak_bytes << " vs " << d.backward_peak_bytes;
    EXPECT_LT(error_of(m.backward_peak_bytes, d.backward_peak_bytes), 0.12) << where << ": " << m.backward_peak_bytes << " vs " << d.backward_peak_bytes;
    EXPECT_EQ(m.parameter_grad_bytes, d.parameter_grad_bytes) << where;
  }
  const int64_t n = model.chain.num_blocks();
  Layout per_block;
  for (int64_t b = 0; b < n; ++b) per_block.segments.push_back({b, b + 1, BlockMode::Recompute});
  for (const auto& [name, layout] : {std::pair<std::string, Layout>{"keep-all", layout_keep_all(n)}, {"per-block", per_block}}) {
    const int64_t predicted = predict(model.chain, layout).peak_bytes;
    const int64_t profiled = predict(direct.chain, layout).peak_bytes;
    EXPECT_GT(error_of(predicted, profiled), -0.01) << what << ", " << name << ": " << predicted << " vs " << profiled;
    EXPECT_LT(error_of(predicted, profiled), 0.05) << what << ", " << name << ": " << predicted << " vs " << profiled;
  }
}

TEST(TrainingPlan, MemoryModelMatchesADirectProfileOfAWiderModel) {
  expect_model_matches_direct_profile(wide_request(4, "no_change", /*bf16=*/true), "LoRA, bf16 autocast");
  expect_model_matches_direct_profile(wide_request(4, "nf4-bnb", /*bf16=*/true), "LoRA on NF4, bf16 autocast");
  expect_model_matches_direct_profile(wide_request(4, "int8-quanto", /*bf16=*/false), "LoRA on int8, float32");
  expect_model_matches_direct_profile(wide_request(0, "no_change", /*bf16=*/false), "full fine-tune, float32");
  // MageFlow: one stack of double-stream blocks, samples packed along the tokens.
  models::MageFlowConfig mage = models::MageFlowConfig::preset("mageflow-tiny");
  mage.num_heads = 8;
  mage.hidden_size = 8 * 16;
  mage.axes_dim = {4, 6, 6};
  mage.depth = 3;
  TrainingPlanRequest request = wide_request(4, "no_change", /*bf16=*/true);
  request.spec.family = "mageflow";
  request.spec.config_json = mage.to_json();
  request.lora_target = model_family("mageflow").lora_target_presets.front();
  expect_model_matches_direct_profile(request, "MageFlow LoRA, bf16 autocast");
}

// Runs the plan as the trainer would (LoRA applied, block swap, the layout) and returns the
// tracked peak of a step after the first (the optimizer state exists, as the model assumes).
int64_t measured_step_peak(const TrainingPlanRequest& request, const TrainingPlan& plan) {
  torch::manual_seed(0);
  auto model = make_transformer(request.spec, c10::Device(c10::kCPU));
  if (request.lora_rank > 0) model->apply_lora(request.lora_target, request.lora_rank, static_cast<double>(request.lora_rank));
  model->module().train();
  if (plan.blocks_to_swap > 0) model->set_block_swap(plan.blocks_to_swap, c10::Device(c10::kCPU));
  if (plan.attention_offload) model->set_attention_offload(SavedTensorOffload{});
  model->set_checkpoint_plan(CheckpointPlan::from_layouts(split_stack_layout(plan.layout, model->stack_sizes())));
  std::vector<at::Tensor> params;
  for (const auto& [name, p] : model->trainable_parameters()) params.push_back(p);
  const auto optimizer = make_optimizer(params, OptimizerSettings{});
  at::Generator generator = at::detail::createCPUGenerator(3);
  const Batch batch = model->synthetic_batch(request.batch, request.image_tokens, request.text_tokens, generator,
                                             c10::Device(c10::kCPU));
  StepSettings settings;
  if (request.bf16) settings.autocast = at::kBFloat16;
  run_training_step(*model, *optimizer, params, batch, settings, generator);
  return run_training_step(*model, *optimizer, params, batch, settings, generator).peak_bytes;
}

// The planner swaps blocks only when the weights leave no room, never keeps a streamed block,
// and its predicted peak is what a step of its plan takes, within 5 % (tracked CPU bytes: the
// streamed weights' host copies are outside the count, the ring inside, as a GPU would hold).
// A full fine-tune streams too: its weights, gradients and optimizer state leave the device.
TEST(TrainingPlan, AFullFineTuneStreamsWhenItsWeightsDoNotFit) {
  TrainingPlanRequest request = wide_request(0, "no_change", /*bf16=*/false);
  const StepMemoryModel model = build_step_memory_model(request);
  TrainingPlanRequest no_swap = request;
  no_swap.blocks_to_swap = 0;
  no_swap.budget_bytes = 1;
  const int64_t smallest_unstreamed = plan_training(model, no_swap).smallest_peak_bytes;
  request.budget_bytes = smallest_unstreamed * 3 / 4;
  const TrainingPlan plan = plan_training(model, request);
  ASSERT_TRUE(plan.fits) << "budget " << request.budget_bytes;
  EXPECT_GT(plan.blocks_to_swap, 0);
  EXPECT_LE(plan.peak_bytes, request.budget_bytes);
  ModelUse use;
  use.training = true;
  use.blocks_to_swap = plan.blocks_to_swap;
  const auto demand = predict_model_memory(request.spec, use);
  ASSERT_TRUE(demand.has_value());
  // Float32 gradients and AdamW's two moments of the streamed blocks: 12 bytes for each parameter
  // the built model's streamed blocks register (admission counts their Linears; norms are the rest).
  auto built = make_transformer(request.spec, c10::Device(c10::kCPU));
  std::vector<std::shared_ptr<torch::nn::Module>> blocks;
  for (const auto& child : built->module().named_children()) {
    if (child.key() != "transformer_blocks" && child.key() != "single_transformer_blocks") continue;
    for (const auto& block : child.value()->children()) blocks.push_back(block);
  }
  ASSERT_EQ(static_cast<int64_t>(blocks.size()), model.chain.num_blocks());
  int64_t streamed_parameters = 0;
  for (size_t b = blocks.size() - static_cast<size_t>(plan.blocks_to_swap); b < blocks.size(); ++b) {
    for (const auto& p : blocks[b]->parameters()) streamed_parameters += p.numel();
  }
  EXPECT_LT(relative(demand->swapped_training_bytes, streamed_parameters * 12), 0.01)
      << demand->swapped_training_bytes << " vs " << streamed_parameters * 12;
  EXPECT_EQ(plan.host_weight_bytes, demand->swapped_weight_bytes);
}

TEST(TrainingPlan, PredictedPeakIsTheTrackedPeakOfThePlannedSteps) {
  TrainingPlanRequest request = wide_request(4, "no_change", /*bf16=*/false);
  const StepMemoryModel model = build_step_memory_model(request);
  const int64_t n = model.chain.num_blocks();

  // Room for everything: every block kept, nothing streamed.
  const TrainingPlan roomy = plan_training(model, request);
  ASSERT_TRUE(roomy.fits);
  EXPECT_EQ(roomy.blocks_to_swap, 0);
  EXPECT_EQ(roomy.options, "--gradient_checkpointing=false");

  // The smallest peak without streaming, less a quarter of the blocks' weights: only streaming fits.
  TrainingPlanRequest no_swap = request;
  no_swap.blocks_to_swap = 0;
  no_swap.budget_bytes = 1;
  const int64_t smallest_unstreamed = plan_training(model, no_swap).smallest_peak_bytes;
  int64_t block_weights = 0;
  for (int64_t w : model.block_weight_bytes) block_weights += w;
  request.budget_bytes = smallest_unstreamed - block_weights / 4;
  const TrainingPlan tight = plan_training(model, request);
  ASSERT_TRUE(tight.fits) << "budget " << request.budget_bytes;
  EXPECT_GT(tight.blocks_to_swap, 0);
  EXPECT_LE(tight.peak_bytes, request.budget_bytes);
  for (const auto& s : tight.layout.segments) {
    if (s.end <= n - tight.blocks_to_swap) continue;
    EXPECT_EQ(s.end - s.begin, 1);
    EXPECT_NE(s.mode, BlockMode::Keep);
  }
  EXPECT_NE(tight.options.find("--musubi_blocks_to_swap=" + std::to_string(tight.blocks_to_swap)), std::string::npos)
      << tight.options;
  // Host and ring bytes are admission's for that many swapped blocks.
  ModelUse use;
  use.training = true;
  use.lora_rank = request.lora_rank;
  use.lora_target = request.lora_target;
  use.blocks_to_swap = tight.blocks_to_swap;
  const auto demand = predict_model_memory(request.spec, use);
  ASSERT_TRUE(demand.has_value());
  EXPECT_EQ(tight.host_weight_bytes, demand->swapped_weight_bytes);
  EXPECT_EQ(tight.ring_bytes, demand->swap_ring_bytes);

  for (const TrainingPlan* plan : {&roomy, &tight}) {
    const int64_t measured = measured_step_peak(request, *plan);
    EXPECT_LT(relative(plan->peak_bytes, measured), 0.05)
        << "swap " << plan->blocks_to_swap << ", " << describe_layout(plan->layout) << ": predicted "
        << plan->peak_bytes << ", measured " << measured;
  }

  // Below the smallest peak any plan reaches: not a fit, and the answer says what reaches the least.
  request.budget_bytes = 1024;
  const TrainingPlan impossible = plan_training(model, request);
  EXPECT_FALSE(impossible.fits);
  EXPECT_GT(impossible.smallest_peak_bytes, request.budget_bytes);
  EXPECT_LT(impossible.smallest_peak_bytes, smallest_unstreamed);
  EXPECT_NE(impossible.smallest_with.find("musubi_blocks_to_swap"), std::string::npos) << impossible.smallest_with;
}

// The attention offload: profiled as a second chain whose kept bytes are lower by what goes to
// the host; the planner takes it when its copies cost less than the recomputation it saves (a
// stated bandwidth decides), and a step of its plan peaks where the plan says, within 5 %.
TEST(TrainingPlan, AttentionOffloadIsWeighedAndItsPredictedPeakIsTheTrackedPeak) {
  TrainingPlanRequest request = wide_request(4, "no_change", /*bf16=*/false);
  request.device = c10::Device(c10::kCUDA);  // the planner chooses the offload for a GPU only
  const StepMemoryModel model = build_step_memory_model(request);
  ASSERT_TRUE(model.attention_offloaded_chain.has_value());
  const int64_t n = model.chain.num_blocks();
  ASSERT_EQ(static_cast<int64_t>(model.block_attention_bytes.size()), n);
  for (int64_t b = 0; b < n; ++b) EXPECT_GT(model.block_attention_bytes[static_cast<size_t>(b)], 0) << "block " << b;
  const int64_t keep_all = predict(model.chain, layout_keep_all(n)).peak_bytes;
  const int64_t keep_all_offloaded = predict(*model.attention_offloaded_chain, layout_keep_all(n)).peak_bytes;
  EXPECT_LT(keep_all_offloaded, keep_all);

  // A budget only the offload fits with every block kept: free copies take it, slow ones recompute.
  request.budget_bytes = keep_all_offloaded;
  request.blocks_to_swap = 0;
  request.allow_offload = false;
  request.host_bandwidth = 1e18;
  const TrainingPlan fast = plan_training(model, request);
  ASSERT_TRUE(fast.fits);
  EXPECT_TRUE(fast.attention_offload);
  for (const auto& segment : fast.layout.segments) {
    EXPECT_EQ(segment.mode, BlockMode::Keep) << describe_layout(fast.layout);
  }
  EXPECT_NE(fast.options.find("--gradient_checkpointing_offload_attention=true"), std::string::npos) << fast.options;
  EXPECT_GT(fast.host_activation_bytes, 0);
  request.host_bandwidth = 1e3;
  const TrainingPlan slow = plan_training(model, request);
  ASSERT_TRUE(slow.fits);
  EXPECT_FALSE(slow.attention_offload);
  EXPECT_EQ(slow.options.find("offload_attention"), std::string::npos) << slow.options;
  // Set by the user: every plan offloads, whatever it costs.
  request.attention_offload = true;
  EXPECT_TRUE(plan_training(model, request).attention_offload);

  // The CPU run of the plan: the tracked bytes are what the device would hold.
  request.device = c10::Device(c10::kCPU);
  const int64_t measured = measured_step_peak(request, fast);
  EXPECT_LT(relative(fast.peak_bytes, measured), 0.05)
      << describe_layout(fast.layout) << " with attention offload: predicted " << fast.peak_bytes << ", measured "
      << measured;
}

}  // namespace training_plan_test
}  // namespace
}  // namespace remat::train
