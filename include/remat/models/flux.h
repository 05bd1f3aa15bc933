#pragma once
/// \file
/// Flux.1 transformer (diffusers FluxTransformer2DModel, in
/// src/diffusers/models/transformers/transformer_flux.py), weight-compatible with
/// the published diffusers checkpoints: parameters carry the diffusers key names
/// (`transformer_blocks.0.attn.to_out.0.weight`, ...), so a state dict loads without remapping.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "remat/export.h"
#include "remat/layout.h"
#include "remat/models/blocks.h"
#include "remat/models/block_swap.h"
#include "remat/models/checkpointing.h"
#include "remat/models/layers.h"
#include "remat/models/lora.h"

namespace remat::models {

/// The fields of diffusers' transformer/config.json that define the architecture.
struct REMAT_API FluxConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  /// Output channels before patch packing; nullopt = in_channels (config.json `null`).
  std::optional<int64_t> out_channels;
  int64_t num_layers = 19;         ///< double-stream blocks
  int64_t num_single_layers = 38;  ///< single-stream blocks
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;
  int64_t pooled_projection_dim = 768;
  bool guidance_embeds = true;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};

  int64_t hidden_size() const { return num_attention_heads * attention_head_dim; }
  int64_t output_channels() const { return out_channels.value_or(in_channels); }

  /// Throws c10::ValueError naming the first invalid field (sizes >= 1, axes_dims_rope even and
  /// summing to attention_head_dim).
  void validate() const;

  /// "flux-dev", "flux-schnell" (the published sizes: FluxTransformer2DModel's constructor
  /// defaults, with guidance_embeds for dev only), "flux-tiny" (2 + 2 blocks, hidden 64
  /// = 2 heads x 32, joint 32, pooled 16, in 64, guidance) and "flux-small" (4 + 8 blocks,
  /// hidden 128 = 2 heads x 64, joint 64, pooled 32, in 64, guidance). Throws
  /// c10::ValueError listing the names otherwise.
  static FluxConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();

  /// Parses a diffusers transformer config.json (its text); unknown keys are ignored, missing ones
  /// keep the defaults above. Throws c10::ValueError on malformed JSON or wrong types.
  static FluxConfig from_json_string(const std::string& json);
  /// Same, reading the file at `path`.
  static FluxConfig from_json_file(const std::string& path);
  /// JSON text when the first non-blank character is '{', otherwise a path to a config.json.
  static FluxConfig from_json(const std::string& path_or_json);
};

/// Number of parameters the model registers for `config`, from the shapes alone (no allocation).
/// flux-dev: 11,901,408,320; flux-schnell: 11,891,178,560.
REMAT_API int64_t parameter_count(const FluxConfig& config);
/// The model's Linear layers (qualified names and shapes) from the config alone, in registration
/// order: what LoRA can target (lora_parameter_count, remat/models/lora.h).
REMAT_API std::vector<LinearShape> linear_layers(const FluxConfig& config);
/// Number of state-dict keys (1160 for flux-dev, 1156 for schnell), from the config alone.
REMAT_API int64_t state_dict_key_count(const FluxConfig& config);

class REMAT_API FluxImpl : public torch::nn::Module {
 public:
  explicit FluxImpl(FluxConfig config);

  /// hidden_states (B, N_i, in_channels) packed latents; encoder_hidden_states (B, N_t, J);
  /// pooled_projections (B, P); timestep (B) sigma in [0, 1] (multiplied by 1000 in the activation
  /// dtype); img_ids (N_i, 3) and txt_ids (N_t, 3) (a (B, N, 3) tensor is accepted and [0] taken);
  /// guidance (B) required iff config.guidance_embeds. Optional ControlNet residuals, each
  /// (B, N_i, D): double block i gets controlnet_block_samples[i / ceil(num_layers / len)] added
  /// to its image output, single block j gets controlnet_single_block_samples[j /
  /// ceil(num_single_layers / len)] added to its image rows (diffusers' default mode). Returns
  /// (B, N_i, patch_size^2 * out_channels) in the model dtype.
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                     const at::Tensor& pooled_projections, const at::Tensor& timestep,
                     const at::Tensor& img_ids, const at::Tensor& txt_ids,
                     const std::optional<at::Tensor>& guidance = std::nullopt,
                     const std::vector<at::Tensor>& controlnet_block_samples = {},
                     const std::vector<at::Tensor>& controlnet_single_block_samples = {});

  /// temb (B, D) = timestep + [guidance] + pooled-text embeddings (diffusers'
  /// CombinedTimestepGuidanceTextProjEmbeddings / CombinedTimestepTextProjEmbeddings).
  at::Tensor time_text_embedding(const at::Tensor& timestep, const std::optional<at::Tensor>& guidance,
                                 const at::Tensor& pooled_projections, at::ScalarType dtype);

  // ---- gradient checkpointing (see remat/checkpoint_plan.h) ----
  /// Sets how the block stacks are checkpointed. Explicit layouts must be two (double stack of
  /// num_layers blocks, single stack of num_single_layers); throws c10::ValueError otherwise or
  /// when the plan is invalid.
  void set_checkpoint_plan(CheckpointPlan plan);
  const CheckpointPlan& checkpoint_plan() const { return checkpointing_; }

  /// SimpleTuner's gradient_checkpointing_offload_attention (remat/activation_offload.h): while
  /// training with autograd recording, every block's attention runs inside an
  /// OffloadSavedTensors scope with these options, checkpointed or not. Unset: off.
  void set_attention_offload(std::optional<SavedTensorOffload> offload) { attention_offload_ = offload; }
  const std::optional<SavedTensorOffload>& attention_offload() const { return attention_offload_; }

  /// Block swap (remat/models/block_swap.h): the frozen weights of the last `blocks_to_swap` of
  /// the num_layers + num_single_layers blocks live in host memory and are streamed to `device`
  /// (default: where the model's weights are) for each use; every other tensor moves to
  /// `device`, so a model too large for it can be built on the host. 0 turns it off (the
  /// weights go back to the device). Call it with LoRA applied. Returns the number of blocks
  /// streamed (the request clamped to the blocks less one, as SimpleTuner); throws
  /// c10::ValueError for a negative request.
  int64_t set_block_swap(int64_t blocks_to_swap, std::optional<at::Device> device = std::nullopt);
  /// The block swap in effect, or null.
  const BlockSwap* block_swap() const { return block_swap_.get(); }
  BlockSwap* block_swap() { return block_swap_.get(); }

  /// Called by forward() with the blocks' input state {x (B, N_i, D), c (B, N_t, D)} just before
  /// the first double block (stage "blocks_begin"), and with the joint output state
  /// {(B, N_t + N_i, D)} just after the last single block ("blocks_end"); see StageObserver.
  /// Empty (the default): not called.
  void set_stage_observer(StageObserver observer) { stage_observer_ = std::move(observer); }

  const FluxConfig& config() const { return config_; }

  Linear x_embedder{nullptr};
  Linear context_embedder{nullptr};
  /// `time_text_embed` holds timestep_embedder, [guidance_embedder,] text_embedder.
  std::shared_ptr<torch::nn::Module> time_text_embed;
  MlpEmbedder timestep_embedder{nullptr}, guidance_embedder{nullptr}, text_embedder{nullptr};
  std::vector<FluxTransformerBlock> transformer_blocks;
  std::vector<FluxSingleTransformerBlock> single_transformer_blocks;
  AdaLayerNormContinuous norm_out{nullptr};
  Linear proj_out{nullptr};

 private:
  FluxConfig config_;
  CheckpointPlan checkpointing_;
  std::optional<SavedTensorOffload> attention_offload_;
  StageObserver stage_observer_;
  std::shared_ptr<BlockSwap> block_swap_;
};
TORCH_MODULE(Flux);

/// Packs VAE latents 2x2 (diffusers' FluxPipeline._pack_latents): (B, C, h, w) with h, w even
/// -> (B, (h/2)(w/2), 4C); token r * (w/2) + c, channel c16 * 4 + dy * 2 + dx.
REMAT_API at::Tensor flux_pack_latents(const at::Tensor& latents);
/// Inverse of flux_pack_latents: (B, (h/2)(w/2), 4C) -> (B, C, h, w); h, w are the latent size.
REMAT_API at::Tensor flux_unpack_latents(const at::Tensor& packed, int64_t height, int64_t width);
/// img_ids for a packed grid of packed_height x packed_width tokens (latent size / 2): row-major
/// (0, r, c), float32 (packed_height * packed_width, 3).
REMAT_API at::Tensor flux_image_ids(int64_t packed_height, int64_t packed_width);
/// FLUX.1 Kontext's ids of one reference picture's packed grid, appended after the img_ids:
/// (1, r, c), float32 (packed_height * packed_width, 3). For one reference this is what
/// diffusers' FluxKontextPipeline.prepare_latents (image_ids[..., 0] = 1) and SimpleTuner's
/// build_kontext_inputs (simpletuner/helpers/models/flux/__init__.py, offsets 0) both make.
REMAT_API at::Tensor flux_reference_ids(int64_t packed_height, int64_t packed_width);
/// txt_ids: zeros, float32 (num_tokens, 3).
REMAT_API at::Tensor flux_text_ids(int64_t num_tokens);

}  // namespace remat::models
