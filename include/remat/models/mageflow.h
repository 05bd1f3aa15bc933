#pragma once
/// \file
/// MageFlow transformer (SimpleTuner MageFlowTransformer2DModel wrapping the vendored MageFlow,
/// simpletuner/helpers/models/mageflow/transformer.py and vendor/models/mage_flow.py): a
/// Flux-style MMDiT with double-stream blocks only, varlen-packed batches (batch dimension 1,
/// samples delimited by cu_seqlens, attention within each sample) and a centred 2-D "msrope" on
/// image tokens only. Parameters carry the reference key names (`img_mod.1.weight`,
/// `img_mlp.net.0.proj.weight`, ...).

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
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

/// The architecture fields of the MageFlow transformer config.json (wrapper constructor names).
struct REMAT_API MageFlowConfig {
  int64_t hidden_size = 3072;
  int64_t num_heads = 24;
  int64_t depth = 12;
  std::vector<int64_t> axes_dim = {16, 56, 56};
  int64_t in_channels = 128;
  std::optional<int64_t> out_channels;  ///< nullopt = kDefaultOutChannels, whatever in_channels is
  int64_t context_in_dim = 2560;
  int64_t patch_size = 1;

  /// The wrapper constructor's out_channels default (MageVAE's 128 latent channels). It does not
  /// follow in_channels, so a config.json without out_channels must build this proj_out to load
  /// the reference's weights.
  static constexpr int64_t kDefaultOutChannels = 128;

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t output_channels() const { return out_channels.value_or(kDefaultOutChannels); }

  /// Throws c10::ValueError naming the first invalid field (heads dividing hidden_size, axes_dim
  /// of three even entries summing to the head dim, sizes >= 1).
  void validate() const;

  /// "mageflow-4b" (MageFlowTransformer2DModel.__init__'s defaults: 12 blocks, hidden 3072,
  /// context 2560), "mageflow-tiny" (2 blocks, hidden 64 = 2 heads x 32, context 32, 128
  /// channels) and "mageflow-small" (6 blocks, hidden
  /// 128 = 2 heads x 64, context 64, 128 channels). Throws c10::ValueError otherwise.
  static MageFlowConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();

  /// Parses a config.json text; legacy keys (mlp_ratio, theta, qkv_bias, ...) are ignored.
  static MageFlowConfig from_json_string(const std::string& json);
  static MageFlowConfig from_json_file(const std::string& path);
  /// JSON text when the first non-blank character is '{', otherwise a path.
  static MageFlowConfig from_json(const std::string& path_or_json);
  /// The transformer/config.json text from_json_string reads back (`_class_name`
  /// MageFlowTransformer2DModel, every architecture field).
  std::string to_json() const;
};

/// Parameters the model registers (4,115,745,408 for mageflow-4b), without allocating.
REMAT_API int64_t parameter_count(const MageFlowConfig& config);
/// The model's Linear layers (qualified names and shapes) from the config alone, in registration
/// order: what LoRA can target (lora_parameter_count, remat/models/lora.h).
REMAT_API std::vector<LinearShape> linear_layers(const MageFlowConfig& config);
/// State-dict keys: 13 + 32 per block (397 for mageflow-4b).
REMAT_API int64_t state_dict_key_count(const MageFlowConfig& config);

/// One image of a pack: (frames, h, w) in latent tokens. frames must be 1.
using ImageShape = std::array<int64_t, 3>;

/// MageFlow's msrope tables for the images of a pack (the vendored MageFlowEmbedRope in
/// mage_layers.py), (ΣL_img, d) float32 with each
/// angle repeated for its pair: frame axis position = index of the image in `img_shapes`, height /
/// width positions centred (r - ceil(h/2), c - ceil(w/2)), inv[j] = 1 / theta^(2j/dim_a) and the
/// angles computed in float32.
REMAT_API RotaryTables mageflow_rope_tables(const std::vector<ImageShape>& img_shapes,
                                            const std::vector<int64_t>& axes_dim,
                                            double theta = 10000.0);

/// Sample boundaries of a packed batch.
struct REMAT_API PackedSamples {
  std::vector<int64_t> txt_cu;  ///< (n + 1) cumulative text-token counts, starting at 0
  std::vector<int64_t> img_cu;  ///< (n + 1) cumulative image-token counts
  at::Tensor txt_sample;        ///< (ΣT) int64: sample index of each text token
  at::Tensor img_sample;        ///< (ΣL) int64: sample index of each image token

  int64_t num_samples() const { return static_cast<int64_t>(txt_cu.size()) - 1; }
  /// From 1-D integer cu_seqlens tensors (any device); the index tensors go to `device`. Throws
  /// c10::ValueError for mismatched lengths, a first entry other than 0 or decreasing entries, and,
  /// when `txt_tokens` / `img_tokens` are given, for a last entry other than them (checked before
  /// the index tensors, whose size is that last entry, are allocated).
  static PackedSamples from_cu_seqlens(const at::Tensor& txt_cu_seqlens,
                                       const at::Tensor& img_cu_seqlens, c10::Device device,
                                       std::optional<int64_t> txt_tokens = std::nullopt,
                                       std::optional<int64_t> img_tokens = std::nullopt);
};

/// Block `transformer_blocks.{i}` (the vendored MageFlowTransformerBlock in mage_layers.py).
class REMAT_API MageFlowTransformerBlockImpl : public torch::nn::Module {
 public:
  MageFlowTransformerBlockImpl(int64_t dim, int64_t heads);

  /// img (1, ΣL, D), txt (1, ΣT, D), temb (n, D), rope (ΣL, d) for the image tokens. Each sample
  /// attends over its own [text; image] tokens only. Returns {txt', img'}.
  /// checkpoint_ffn: run both streams' FFN part inside one remat::checkpoint with that backend.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& img, const at::Tensor& txt,
                                            const at::Tensor& temb, const RotaryTables& rope,
                                            const PackedSamples& samples,
                                            std::optional<Backend> checkpoint_ffn = std::nullopt,
                                            const std::optional<SavedTensorOffload>& offload_attention = std::nullopt);

  torch::nn::ModuleList img_mod{nullptr}, txt_mod{nullptr};  ///< {SiLU, Linear(D -> 6D)}
  Linear img_mod_linear{nullptr}, txt_mod_linear{nullptr};   ///< the `.1` entries
  Attention attn{nullptr};
  FeedForward img_mlp{nullptr}, txt_mlp{nullptr};
};
TORCH_MODULE(MageFlowTransformerBlock);

class REMAT_API MageFlowImpl : public torch::nn::Module {
 public:
  explicit MageFlowImpl(MageFlowConfig config);

  /// img (1, ΣL, in_channels) image tokens of all samples (row-major per image, images in pack
  /// order); txt (1, ΣT, context_in_dim); timesteps (n) sigma in [0, 1]; img_shapes one (1, h, w)
  /// per image in pack order (Σ h*w = ΣL); img_cu_seqlens / txt_cu_seqlens (n + 1) integer tensors
  /// (per sample: its target image plus references); skip_layers: block indices run as identity.
  /// Returns (1, ΣL, patch_size^2 * out_channels).
  at::Tensor forward(const at::Tensor& img, const at::Tensor& txt, const at::Tensor& timesteps,
                     const std::vector<ImageShape>& img_shapes, const at::Tensor& img_cu_seqlens,
                     const at::Tensor& txt_cu_seqlens, const std::vector<int64_t>& skip_layers = {});

  // ---- gradient checkpointing (see remat/checkpoint_plan.h) ----
  /// Sets how the block stack is checkpointed. An explicit layout (one) covers the blocks that run
  /// (depth, or depth minus skip_layers: a mismatch throws c10::ValueError at forward time).
  /// Throws c10::ValueError when the plan is invalid or a layout covers more than depth blocks.
  void set_checkpoint_plan(CheckpointPlan plan);
  const CheckpointPlan& checkpoint_plan() const { return checkpointing_; }

  /// SimpleTuner's gradient_checkpointing_offload_attention (remat/activation_offload.h): while
  /// training with autograd recording, every block's attention runs inside an
  /// OffloadSavedTensors scope with these options, checkpointed or not. Unset: off.
  void set_attention_offload(std::optional<SavedTensorOffload> offload) { attention_offload_ = offload; }
  const std::optional<SavedTensorOffload>& attention_offload() const { return attention_offload_; }

  /// Block swap (remat/models/block_swap.h), as Flux::set_block_swap: the last `blocks_to_swap`
  /// of the depth blocks stream their frozen weights from host memory to `device`. Training with
  /// skip_layers and block swap together throws c10::ValueError at forward time.
  int64_t set_block_swap(int64_t blocks_to_swap, std::optional<at::Device> device = std::nullopt);
  /// The block swap in effect, or null.
  const BlockSwap* block_swap() const { return block_swap_.get(); }
  BlockSwap* block_swap() { return block_swap_.get(); }

  /// Called by forward() with the blocks' input state {txt (1, ΣT, D), img (1, ΣL, D)} (stage
  /// "blocks_begin") and with {img} after the last block ("blocks_end"); see StageObserver.
  void set_stage_observer(StageObserver observer) { stage_observer_ = std::move(observer); }

  const MageFlowConfig& config() const { return config_; }

  Linear img_in{nullptr};
  RMSNorm txt_norm{nullptr};
  Linear txt_in{nullptr};
  std::shared_ptr<torch::nn::Module> time_text_embed;  ///< holds `timestep_embedder`
  MlpEmbedder timestep_embedder{nullptr};
  std::vector<MageFlowTransformerBlock> transformer_blocks;
  AdaLayerNormContinuous norm_out{nullptr};
  Linear proj_out{nullptr};

 private:
  MageFlowConfig config_;
  CheckpointPlan checkpointing_;
  std::optional<SavedTensorOffload> attention_offload_;
  StageObserver stage_observer_;
  std::shared_ptr<BlockSwap> block_swap_;
};
TORCH_MODULE(MageFlow);

}  // namespace remat::models
