#pragma once
/// \file
/// `remat plan`: the memory layout of a training run chosen for a device-memory budget from the
/// model's config alone, without loading a weight. One planner over every mechanism remat has:
/// per block keep, recompute or offload the activations (remat/plan.h), the attention side's
/// activations in host memory (remat/activation_offload.h), and stream the frozen weights of the
/// last blocks from host memory (block swap, remat/weight_stream.h).
///
/// The memory model (Note [Plan memory model] in src/train/memory/training_plan.cpp): the same
/// architecture at four narrow widths (1 to 4 attention heads of the real head size, two blocks per
/// stack, random weights, tokens in proportion to the width) is profiled on the CPU with remat's
/// step profiler at the run's batch and precision; every figure, a polynomial of degree at most 3
/// in the heads along that line, is extended to the real head count. Weights, gradients and
/// optimizer state come from the config (remat/train/memory/admission.h). Step time is modelled
/// from the blocks' FLOPs at a stated device throughput and the weight copies at a stated host
/// bandwidth.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "remat/export.h"
#include "remat/plan.h"
#include "remat/train/family/transformer.h"
#include "remat/train/memory/auto_layout.h"

namespace remat::train {

struct TrainConfig;

/// What to plan: one training step's shapes and the budgets.
struct TrainingPlanRequest {
  /// The model (family, flavour or config JSON, base_precision).
  TransformerSpec spec;
  /// > 0: LoRA of this rank on `lora_target` (only the factors train); 0: full fine-tune.
  int64_t lora_rank = 0;
  std::string lora_target;
  int64_t batch = 1;
  int64_t image_tokens = 0;
  int64_t text_tokens = 0;
  /// mixed_precision bf16: float32 weights, bfloat16 autocast (what the trainer runs).
  bool bf16 = true;
  /// The device planned for: on CUDA offloaded activations leave the device; on the CPU they stay.
  c10::Device device{c10::kCUDA};
  /// Device bytes the step's peak must fit.
  int64_t budget_bytes = 0;
  /// Host bytes the streamed weights and offloaded activations may take; unset: no limit.
  std::optional<int64_t> host_budget_bytes;
  /// Set: musubi_blocks_to_swap as the user gave it (clamped to the blocks less one); unset: the
  /// planner chooses (a full fine-tune streams weights, gradients and optimizer state).
  std::optional<int64_t> blocks_to_swap;
  /// Whether activations may be offloaded to host memory (gradient_checkpointing_backend unsloth).
  bool allow_offload = true;
  /// Set: gradient_checkpointing_offload_attention as the user gave it (true: every plan offloads
  /// the attention side); unset: the planner chooses.
  std::optional<bool> attention_offload;
  /// Stated throughput of the blocks' matrix products, FLOP/s (an H100's bf16 at about half of
  /// its dense peak: 400e12).
  double device_flops = 400e12;
  /// Stated host <-> device copy bandwidth, bytes/s (pinned PCIe 4.0 x16: about 20e9).
  double host_bandwidth = 20e9;
};

/// Packed image tokens of a square picture of `config.resolution` pixels a side (megapixels
/// below 16, SimpleTuner's area mode) for the config's family.
REMAT_API int64_t image_tokens_for_resolution(const TrainConfig& config);

/// The transformer a `remat train` configuration trains, as a planner sees it without its
/// weights: family, flavour and base_model_precision, and the model's config.json when its files
/// are on this machine (a hub id in the local cache, a folder), else pretrained_transformer_config,
/// else nothing (the flavour's shapes). `read_model_files`, when given, says whether the model's
/// own config.json was read. `remat plan` and `remat ui`'s plan share it.
REMAT_API TransformerSpec planned_spec_of(const TrainConfig& config, bool* read_model_files = nullptr);

/// The request's fields from a `remat train` configuration (model, LoRA, batch, resolution,
/// tokenizer_max_length, mixed_precision, base_model_precision, musubi_blocks_to_swap when > 0,
/// gradient_checkpointing_backend, device), with `budget_bytes` and `host_budget_bytes` given.
/// Image tokens are the family's for a square picture of `resolution` pixels a side.
REMAT_API TrainingPlanRequest plan_request_of(const TrainConfig& config, int64_t budget_bytes,
                                              std::optional<int64_t> host_budget_bytes);

/// The measured model of one training step at the request's shapes (budgets aside): build it
/// once, plan it for many budgets.
struct StepMemoryModel {
  /// The chain with every block's weights on the device (no swap); times from FLOPs. Profiled
  /// with the attention offload when the request sets it true, without it otherwise.
  Chain chain;
  /// When the request leaves the attention offload to the planner: the same chain profiled with
  /// it (the tracked bytes of a CPU profile are what the device would hold).
  std::optional<Chain> attention_offloaded_chain;
  /// Per block, the device bytes the attention offload moves to host memory until the block's
  /// backward (its kept bytes without the offload less those with it); empty when the model was
  /// profiled one way only and the request does not set the offload.
  std::vector<int64_t> block_attention_bytes;
  std::vector<int64_t> stack_sizes;
  std::vector<std::string> stack_names;
  /// Device bytes of each block's frozen Linear weights as stored (what swapping it moves).
  std::vector<int64_t> block_weight_bytes;
  /// Fixed bytes besides weights, gradients and optimizer state (inputs, position tables),
  /// extended from the proxies: chain.fixed_bytes = this + the demand of the config.
  int64_t other_fixed_bytes = 0;
  /// Seconds the proxies' profiles took, for the log.
  double profile_s = 0.0;
};

/// What the model extends: profile_step (remat/train/memory/auto_layout.h) of `spec` built as the
/// trainer builds it (float32, base_precision, LoRA of the request), on the CPU at the request's
/// shapes, every block checkpointed. Public for the tests that check the extension against a
/// direct profile of a wider model.
REMAT_API StepModel profile_step_for_plan(const TransformerSpec& spec, const TrainingPlanRequest& request);

/// Profiles the four proxies and builds the model. Throws c10::ValueError for a family without a
/// PlanProxy (naming the families that have one), an empty shape, or a bad spec.
REMAT_API StepMemoryModel build_step_memory_model(const TrainingPlanRequest& request);

/// One group of consecutive blocks of one stack that the plan treats alike.
struct PlanGroup {
  std::string stack;
  int64_t first = 0, last = 0;     ///< block indices in the whole chain, inclusive
  BlockMode mode = BlockMode::Keep;
  int64_t blocks_per_segment = 1;  ///< checkpointed segments' length (1 for Keep)
  bool streamed = false;           ///< weights streamed from host memory
};

struct TrainingPlan {
  bool fits = false;
  int64_t budget_bytes = 0;
  std::optional<int64_t> host_budget_bytes;
  Layout layout;
  std::vector<PlanGroup> groups;
  /// musubi_blocks_to_swap of the plan (0: none).
  int64_t blocks_to_swap = 0;
  /// gradient_checkpointing_offload_attention of the plan.
  bool attention_offload = false;
  /// Predicted device peak of a step (weights, gradients, optimizer state, activations).
  int64_t peak_bytes = 0;
  /// Host memory: the streamed weights (pinned) and the offloaded activations at their most.
  int64_t host_weight_bytes = 0;
  int64_t host_activation_bytes = 0;
  /// Device ring of the streamed weights (2 slots of the largest streamed block).
  int64_t ring_bytes = 0;
  /// Predicted step seconds (blocks, recomputation, exposed copies) and the same for every block
  /// kept with every weight on the device (the fastest layout, whatever memory it needs).
  double step_s = 0.0;
  double reference_step_s = 0.0;
  /// Of step_s: weight copies the computation does not hide.
  double exposed_copy_s = 0.0;
  /// Of step_s: the attention activations' copies back to the device (just in time, exposed).
  double attention_copy_s = 0.0;
  /// When nothing fits: the smallest peak any plan reaches and the plan that reaches it.
  int64_t smallest_peak_bytes = 0;
  std::string smallest_with;

  double step_factor() const { return reference_step_s > 0.0 ? step_s / reference_step_s : 1.0; }
  /// The `remat train` options that run this plan, e.g. "--gradient_checkpointing_interval=1
  /// --musubi_blocks_to_swap=19".
  std::string options;
};

/// The fastest plan whose predicted peak fits request.budget_bytes (and whose host bytes fit
/// host_budget_bytes): over every block-swap count allowed (all when the request leaves it unset,
/// else the one given), the exact budget planner (remat/plan.h) with
/// streamed blocks checkpointed one per segment. When nothing fits, `fits` is false and the
/// plan is the one with the smallest peak.
REMAT_API TrainingPlan plan_training(const StepMemoryModel& model, const TrainingPlanRequest& request);

/// The plan as `remat plan` prints it: one line per block group, then
/// "predicted device peak: N GiB", host memory, the step-time factor and the options.
REMAT_API std::string format_training_plan(const TrainingPlan& plan);

}  // namespace remat::train
