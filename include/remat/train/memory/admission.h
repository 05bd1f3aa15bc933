#pragma once
/// \file
/// Memory admission: before a model is allocated, the memory its weights (and, for training, the
/// gradients and AdamW state of its trainable parameters) will take is predicted from the config
/// alone and compared with what the device has available. A model that cannot fit is refused
/// with both figures and the options that would make it fit, instead of being built until the
/// kernel's OOM killer ends the process. `remat train`, `remat init`, `remat forward` and
/// `remat bench` admit every model they build; `--skip_memory_check` overrides.
///
/// What is not predicted: activations (they depend on the batch and the checkpoint layout; the
/// auto planner, remat/train/memory/auto_layout.h, budgets them) and the allocator's own overhead.

#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/Device.h>

#include "remat/export.h"
#include "remat/train/family/transformer.h"
#include "remat/train/options/config.h"

namespace remat::train {

/// How a model will be used, for the prediction.
struct ModelUse {
  /// Bytes per weight element as built (make_transformer builds float32 weights; a later cast to
  /// bfloat16 still holds the float32 copy first).
  int64_t weight_element_bytes = 4;
  /// Whether the trainable parameters get float32 gradients and AdamW state (exp_avg, exp_avg_sq).
  bool training = false;
  /// > 0: LoRA of this rank on `lora_target`; only the factors train. 0: every parameter trains.
  int64_t lora_rank = 0;
  /// The family's LoRA target preset (remat/train/family/family.h).
  std::string lora_target;
  /// How the caller's command line asks for LoRA (e.g. "--model_type=lora"), suggested when full
  /// training does not fit but LoRA would; empty: not suggested.
  std::string lora_flag;
  /// What the override is called on the caller's command line.
  std::string override_flag = "--skip_memory_check";
  /// How the frozen base's Linears are stored (TransformerSpec::base_precision).
  models::BasePrecision base_precision;
  /// The caller's flag for it (e.g. "--base_model_precision"): when set, a LoRA run (or a
  /// model built for inference) that does not fit is told which quantised precision would.
  std::string precision_flag;
  /// Data-parallel processes the run has (WORLD_SIZE); the prediction is per process.
  int world_size = 1;
  /// use_ema with the average on this device (ema_lives_on): a float32 copy of the trainable
  /// parameters.
  bool ema = false;
  /// ZeRO stage (TrainConfig::zero_stage): 1 keeps only this rank's shard of the optimizer state
  /// (remat/train/optimizers/zero_optimizer.h). Needs a full fine-tune and world_size > 1 to shard anything.
  int zero_stage = 0;
  /// musubi_blocks_to_swap (already clamped): the last N blocks' frozen Linear weights live in
  /// host memory; the device holds a ring of swap_ring_slots blocks (the largest checkpointed
  /// chunk of swapped blocks + 1; 2 with per-block checkpointing).
  int64_t blocks_to_swap = 0;
  int64_t swap_ring_slots = 2;
};

/// The prediction, in bytes on the device.
struct MemoryDemand {
  int64_t parameters = 0;       ///< of the transformer, LoRA factors included
  int64_t trainable = 0;        ///< of which train (0 unless ModelUse::training)
  /// Every weight: the quantised Linears at models::quantized_weight_bytes (data and scales),
  /// every other parameter at weight_element_bytes.
  int64_t weight_bytes = 0;
  int64_t quantized_linears = 0;         ///< Linears stored quantised
  int64_t quantized_weight_bytes = 0;    ///< of weight_bytes, what they hold
  /// dequantized_bytes of the largest quantised Linear: the dequantised weight exists only inside
  /// that layer's forward or backward, one layer at a time.
  int64_t dequantized_transient_bytes = 0;
  int64_t gradient_bytes = 0;   ///< trainable x 4 (float32 gradients)
  /// trainable x 8 (AdamW's two float32 moments); with ZeRO-1, the fullest rank's shard.
  int64_t optimizer_bytes = 0;
  /// ZeRO-1: the ranks the optimizer state is sharded over (1: not sharded).
  int optimizer_shards = 1;
  /// ZeRO-1: the broadcast buffer of the updated weights, alive after the optimizer step (one
  /// bucket, Note [ZeRO broadcasts] in zero_optimizer.cpp).
  int64_t broadcast_bytes = 0;
  /// ModelUse::ema: trainable x 4 (the float32 average), on every rank.
  int64_t ema_bytes = 0;
  /// Block swap: the frozen Linear weights of the swapped blocks, in host memory (not in
  /// weight_bytes), and the device ring that streams them (in weight_bytes).
  int64_t swapped_weight_bytes = 0;
  int64_t swap_ring_bytes = 0;
  /// A full fine-tune's streamed blocks: their float32 gradients and AdamW state, in host memory
  /// (not in gradient_bytes / optimizer_bytes, which keep one block's gradients for the time
  /// between its backward and its release).
  int64_t swapped_training_bytes = 0;
  int64_t total() const {
    return weight_bytes + dequantized_transient_bytes + gradient_bytes + optimizer_bytes + broadcast_bytes + ema_bytes;
  }
};

/// Bytes alive while a quantised Linear of `elements` weights is dequantised to a dtype of
/// `element_bytes`: two float32 tensors of its size (the expanded codes and the scaled weight,
/// models::dequantize_weight works in float32) plus the cast copy when the dtype is not float32.
REMAT_API int64_t dequantized_bytes(int64_t elements, int64_t element_bytes);

/// Whether a run of `config` on `device` keeps its EMA average (use_ema) in that device's memory
/// between updates: always on a CPU run; on an accelerator with ema_device accelerator (and not
/// ema_cpu_only).
REMAT_API bool ema_lives_on(const TrainConfig& config, const c10::Device& device);

/// Predicts the memory of building `spec` for `use`, without allocating, from the family's
/// parameter count and Linear layers (ModelFamily::parameter_count, linear_layers). nullopt when
/// the family provides no count (or, for a quantised base, no Linear layers). Throws c10::ValueError for a bad spec (unknown family, preset,
/// config.json).
REMAT_API std::optional<MemoryDemand> predict_model_memory(const TransformerSpec& spec, const ModelUse& use);

/// The Linear weights (and biases) of each transformer block as `use` stores them, in run order:
/// what block swap moves to host memory for each swapped block. Empty for a family without
/// Linear layers or block stacks.
REMAT_API std::vector<int64_t> block_weight_bytes(const TransformerSpec& spec, const ModelUse& use);

/// Per process of a data-parallel run on `world_size` processes with ZeRO stage `zero_stage` (0
/// or 1): predict_model_memory with ModelUse::world_size and zero_stage set. Every rank holds the
/// weights and, data-parallel gradients being views into the reducer's buckets, every gradient
/// for the whole step; with ZeRO-1 the optimizer state is the largest shard of the greedy
/// assignment (assign_to_ranks) over the family's Linear weights in registration order plus the
/// remaining parameters as one more tensor (the real assignment runs over the model's tensors;
/// Linears hold all but ~0.1% of Flux's weights, so the two agree closely).
REMAT_API std::optional<MemoryDemand> predict_rank_memory(const TransformerSpec& spec, ModelUse use, int world_size,
                                                          int zero_stage);

/// Refuses `spec` for `use` on `device` when its predicted demand exceeds `available_bytes`
/// (default: memory::available_bytes(device)): throws ValidationError (option model_flavour) whose message
/// gives the demand (weights, gradients, optimizer state), the bytes available, the options that
/// would fit (the quantised base precisions that would, when ModelUse::precision_flag is set;
/// smaller flavours of the family; LoRA when training in full; each with its prediction) and
/// ModelUse::override_flag. Does nothing when the family has no count.
REMAT_API void admit_model(const TransformerSpec& spec, const ModelUse& use, const c10::Device& device,
                           std::optional<int64_t> available_bytes = std::nullopt);

}  // namespace remat::train
