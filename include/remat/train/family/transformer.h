#pragma once
/// \file
/// A model family as training and benchmarking see it: build the transformer from a flavour or a
/// config.json, load pretrained weights, configure checkpointing and LoRA, and compute the
/// flow-matching loss of a batch. The trainer (`remat train`) and the benchmark (`remat bench`)
/// run exactly this step, so what the benchmark measures is what training does.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "remat/activation_offload.h"
#include "remat/export.h"
#include "remat/checkpoint.h"
#include "remat/checkpoint_plan.h"
#include "remat/layout.h"
#include "remat/models/block_swap.h"
#include "remat/models/quantization.h"
#include "remat/sample/sampler.h"
#include "remat/sample/scheduler.h"
#include "remat/train/data/data.h"

namespace remat::train {

/// Flow matching (rectified flow) for one batch, as SimpleTuner trains Flux: with sigma in [0,1]
/// per sample, x_t = (1 - sigma) x0 + sigma noise, and the model predicts target = noise - x0.
struct FlowMatchingOptions {
  double shift = 3.0;            ///< sigma' = shift s / (1 + (shift - 1) s); 0 = no shift
  double sigmoid_scale = 1.0;    ///< logit-normal sampling scale
  bool uniform = false;          ///< sample sigma uniformly instead
  double guidance_value = 1.0;   ///< guidance input for guidance-distilled models (Flux dev)
};

/// How to build a transformer.
struct TransformerSpec {
  std::string family;                       ///< a registered family (remat/train/family/family.h)
  std::string flavour;                      ///< a model_flavour of the family (or a models:: preset name); empty: its small one
  std::optional<std::string> config_json;   ///< a diffusers-style config.json (overrides flavour)
  std::optional<std::string> weights;       ///< a .safetensors file or a component folder (config.json + weights, possibly sharded) to load strictly
  /// The weights variant of a component folder (`<base>.<variant>.safetensors`,
  /// models::find_component_weights); empty: the plain files.
  std::string variant;
  /// How the frozen base's Linear weights are stored (base_model_precision): none keeps them in
  /// float32; otherwise the Linears models::is_quantized_linear_name picks are quantised (for
  /// LoRA: apply_lora wraps them afterwards, training only the factors).
  models::BasePrecision base_precision;
  /// The dtype the model is built in, directly (no float32 copy of a bf16 model): float32 for
  /// training, the published bfloat16 for sampling.
  at::ScalarType dtype = at::kFloat;
};

/// One model family behind a common interface.
class REMAT_API Transformer {
 public:
  virtual ~Transformer() = default;

  /// The family's registered name.
  virtual std::string family() const = 0;
  virtual torch::nn::Module& module() = 0;

  /// Block stacks and their lengths, in execution order (Flux: {num_layers, num_single_layers};
  /// MageFlow: {depth}). The planner treats each stack start as a forced segment boundary.
  virtual std::vector<int64_t> stack_sizes() const = 0;

  /// Sets how the block stacks are checkpointed (one plan for the whole model; explicit layouts
  /// one per stack of stack_sizes()). Throws c10::ValueError for a plan that does not fit.
  virtual void set_checkpoint_plan(const CheckpointPlan& plan) = 0;

  /// Block swap (musubi_blocks_to_swap, remat/models/block_swap.h): the frozen weights of the
  /// last `blocks_to_swap` blocks live in host memory and are streamed to `device` for each use;
  /// everything else moves to `device` (the model may be built on the host). 0 turns it off.
  /// Returns the number of blocks streamed (clamped to the blocks less one). Families without it
  /// (CheckpointingCapabilities::block_swap false) throw c10::ValueError.
  virtual int64_t set_block_swap(int64_t blocks_to_swap, const at::Device& device);
  /// gradient_checkpointing_offload_attention (remat/activation_offload.h): while training, the
  /// blocks' attention runs inside an OffloadSavedTensors scope with these options; unset turns
  /// it off. Families without it (CheckpointingCapabilities::attention_offload false) throw
  /// c10::ValueError for a set value.
  virtual void set_attention_offload(const std::optional<SavedTensorOffload>& offload);
  /// The block swap in effect, or null.
  virtual const models::BlockSwap* block_swap() const { return nullptr; }
  virtual models::BlockSwap* block_swap() { return nullptr; }

  /// Enables LoRA on one of the family's target presets (ModelFamily::lora_target_presets);
  /// returns the wrapped module names.
  std::vector<std::string> apply_lora(const std::string& target_preset, int64_t rank, double alpha);

  /// Mean-squared flow-matching loss of `batch` (tensors already on the model's device).
  /// Draws noise and sigmas from `generator` in a fixed order (noise, then sigmas), so a run is
  /// reproducible from the generator state. Returns a float32 scalar.
  virtual at::Tensor flow_matching_loss(const Batch& batch, const FlowMatchingOptions& options,
                                        at::Generator& generator) = 0;

  /// The forward pass on inputs named as the reference's arguments (Flux: hidden_states,
  /// encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids, [guidance]). Inputs
  /// are converted to float32 (MageFlow: its image and text states to the model's dtype). Throws naming every missing or unexpected input, or a non-floating
  /// dtype; the model names wrong shapes.
  virtual at::Tensor forward_named(const std::map<std::string, at::Tensor>& inputs) = 0;

  /// One representative block of each stack with state and context shaped as `batch` makes
  /// them, for profiling its time and memory (remat/profile.h). The state requires grad, as it
  /// does inside the chain; the context requires grad when its producers train.
  /// `ffn_checkpoint`: run the blocks with only their feed-forward part checkpointed with that
  /// backend (the "-ffn" checkpointing backends), as a training step with that setting does.
  struct BlockProbe {
    std::string kind;      ///< "flux-double", "flux-single", "mageflow-block"
    RunBlock run;          ///< runs the stack's block 0 (the index argument is ignored)
    Tensors state;
    /// The trainable parameters of the probed block (every block of a stack has the same).
    std::vector<at::Tensor> parameters;
  };
  virtual std::vector<BlockProbe> block_probes(const Batch& batch,
                                               std::optional<Backend> ffn_checkpoint = std::nullopt) = 0;

  /// Observer of the block stacks' boundaries in forward: called with the first block's input
  /// state ("blocks_begin") and the last block's output state ("blocks_end"). It must not keep
  /// the tensors. An empty function removes it.
  using StageObserver = std::function<void(const std::string& stage, const Tensors& state)>;
  virtual void set_stage_observer(StageObserver observer) = 0;

  /// A random batch shaped as the family's latent cache (float32 on `device`): `batch` samples
  /// of `image_tokens` packed image tokens (Flux: latents (B, C, 2r, 2c) with r x c = image_tokens
  /// the most square grid) and `text_tokens` text embeddings (B, text_tokens, J), pooled (B, P).
  /// For benchmarks and profiling. Throws c10::ValueError for counts < 1.
  virtual Batch synthetic_batch(int64_t batch, int64_t image_tokens, int64_t text_tokens,
                                at::Generator& generator, const at::Device& device) = 0;

  /// Its family's denoising loop on this transformer as it is (mode, LoRA branches, device), with
  /// `scheduler`; the Denoiser refers to this transformer, which must outlive it. Throws
  /// c10::ValueError for a family that does not sample (ModelFamily::samples).
  virtual std::unique_ptr<sample::Denoiser> denoiser(const sample::FlowMatchSchedulerConfig& scheduler);

  /// Trainable parameters with their names (module paths).
  std::vector<std::pair<std::string, at::Tensor>> trainable_parameters();
};

/// Builds the transformer of `spec` on `device` (weights in spec.dtype) through its family's
/// descriptor, loading `spec.weights` strictly when given, and quantises its base Linears when
/// spec.base_precision asks for it. Throws c10::ValueError naming what is wrong (an unknown
/// family or preset, a bad config.json or weights file, fp8 without float8 dtypes).
REMAT_API std::unique_ptr<Transformer> make_transformer(const TransformerSpec& spec,
                                                        const at::Device& device);

/// Moves a batch's tensors to `device` as float32.
REMAT_API Batch batch_to(const Batch& batch, const at::Device& device);

/// x_t and target of flow matching for latents x0, noise and per-sample sigmas (B): sigma is
/// broadcast over the remaining dimensions. Returns {x_t, target}.
REMAT_API std::pair<at::Tensor, at::Tensor> flow_matching_pair(const at::Tensor& x0,
                                                               const at::Tensor& noise,
                                                               const at::Tensor& sigmas);

}  // namespace remat::train
