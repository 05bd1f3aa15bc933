#pragma once
/// \file
/// DiT pieces shared by Flux.1 and MageFlow: rotary position tables and their interleaved-pair
/// application, the joint q/k-normalised attention, and the Flux double- and single-stream
/// blocks (diffusers src/diffusers/models/transformers/transformer_flux.py: FluxPosEmbed,
/// FluxAttnProcessor, FluxTransformerBlock, FluxSingleTransformerBlock). MageFlow's block
/// (mageflow.h) reuses the attention projections.

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "remat/activation_offload.h"
#include "remat/checkpoint.h"
#include "remat/export.h"
#include "remat/models/layers.h"

namespace remat::models {

/// Rotary tables with each angle repeated for the two lanes of its pair: cos and sin, both
/// (N, d) float32, lane 2j and 2j+1 holding cos/sin of angle j.
struct RotaryTables {
  at::Tensor cos;
  at::Tensor sin;
};

/// diffusers' FluxPosEmbed (transformer_flux.py, through get_1d_rotary_pos_embed of
/// models/embeddings.py): ids (N, 3) (any float dtype; text rows first),
/// axes_dims summing to d. For axis a, inv[j] = 1 / theta^(2j / dim_a) and angle = pos * inv are
/// computed in float64, cos/sin taken in float64 and cast to float32; lanes are the axes in order.
REMAT_API RotaryTables flux_rope_tables(const at::Tensor& ids, const std::vector<int64_t>& axes_dims,
                                        double theta = 10000.0);

/// Rotates adjacent pairs (x[2j], x[2j+1]) by the tables: out[2j] = x0 cos - x1 sin,
/// out[2j+1] = x1 cos + x0 sin. x (B, N, H, d) with the sequence on dim 1; tables (N, d).
/// Computed in float32 (float64 for float64 x) and cast back to the dtype of x.
REMAT_API at::Tensor apply_rope(const at::Tensor& x, const RotaryTables& rope);

/// Splits the last dim into heads: (B, N, H*d) -> (B, N, H, d), head h on lanes [h*d, (h+1)*d).
REMAT_API at::Tensor split_heads(const at::Tensor& x, int64_t heads);

/// Softmax attention (scale 1/sqrt(d), no mask) on (B, N, H, d) tensors through
/// remat::compat::scaled_dot_product_attention; returns (B, N, H*d) in the dtype of q.
REMAT_API at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

/// q, k, v of one stream after the q/k RMSNorm, each (B, N, H, d), before RoPE.
struct QKV {
  at::Tensor q, k, v;
};

/// diffusers `Attention` as Flux and MageFlow configure it: `to_q/to_k/to_v` (D -> D) with
/// RMSNorm `norm_q/norm_k` (weight (d)); with `context` also `add_q_proj/add_k_proj/add_v_proj`,
/// `norm_added_q/norm_added_k` and `to_add_out`; with `output` also `to_out.0` (D -> D; to_out.1
/// is a parameter-free Dropout(0)).
class REMAT_API AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(int64_t dim, int64_t heads, bool context, bool output);

  /// Image (or joint) stream: (B, N, D) -> normalised q, k and v.
  QKV project(const at::Tensor& x);
  /// Text stream through the added projections: (B, N_t, D) -> normalised q, k and v.
  QKV project_context(const at::Tensor& c);

  int64_t heads() const { return heads_; }

  Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
  RMSNorm norm_q{nullptr}, norm_k{nullptr};
  Linear add_q_proj{nullptr}, add_k_proj{nullptr}, add_v_proj{nullptr};
  RMSNorm norm_added_q{nullptr}, norm_added_k{nullptr};
  torch::nn::ModuleList to_out{nullptr};
  Linear to_out_0{nullptr};  ///< the Linear at `to_out.0` (same module)
  Linear to_add_out{nullptr};

 private:
  int64_t heads_;
};
TORCH_MODULE(Attention);

/// Flux double-stream block `transformer_blocks.{i}` (diffusers' FluxTransformerBlock.forward).
class REMAT_API FluxTransformerBlockImpl : public torch::nn::Module {
 public:
  FluxTransformerBlockImpl(int64_t dim, int64_t heads);

  /// x (B, N_i, D) image, c (B, N_t, D) text, temb (B, D), rope over the joint [text; image]
  /// sequence (N_t + N_i, d). Returns {c', x'} (text first, as diffusers).
  /// checkpoint_ffn: run the feed-forward part of both streams (norm2 -> modulate -> FF -> gated
  /// residual) inside one remat::checkpoint with that backend (SimpleTuner's "-ffn" scope); this
  /// block must then outlive the backward pass.
  /// offload_attention: run the attention (projections, q/k norms, rotation, attention, output
  /// projections) inside a remat::OffloadSavedTensors scope, as SimpleTuner wraps `self.attn(...)`
  /// for gradient_checkpointing_offload_attention.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const at::Tensor& c,
                                            const at::Tensor& temb, const RotaryTables& rope,
                                            std::optional<Backend> checkpoint_ffn = std::nullopt,
                                            const std::optional<SavedTensorOffload>& offload_attention = std::nullopt);

  AdaLayerNormZero norm1{nullptr}, norm1_context{nullptr};
  Attention attn{nullptr};
  FeedForward ff{nullptr}, ff_context{nullptr};
};
TORCH_MODULE(FluxTransformerBlock);

/// Flux single-stream block `single_transformer_blocks.{j}` (diffusers'
/// FluxSingleTransformerBlock.forward).
class REMAT_API FluxSingleTransformerBlockImpl : public torch::nn::Module {
 public:
  FluxSingleTransformerBlockImpl(int64_t dim, int64_t heads, int64_t mlp_ratio = 4);

  /// s (B, N, D) the joint [text; image] sequence, temb (B, D), rope (N, d); returns s'.
  /// checkpoint_ffn: run proj_mlp -> GELU -> concat with the attention output -> proj_out ->
  /// gate -> residual inside one remat::checkpoint with that backend. offload_attention: as the
  /// double block's (projections, q/k norms, rotation, attention).
  at::Tensor forward(const at::Tensor& s, const at::Tensor& temb, const RotaryTables& rope,
                     std::optional<Backend> checkpoint_ffn = std::nullopt,
                     const std::optional<SavedTensorOffload>& offload_attention = std::nullopt);

  AdaLayerNormZeroSingle norm{nullptr};
  Attention attn{nullptr};
  Linear proj_mlp{nullptr};
  Linear proj_out{nullptr};
};
TORCH_MODULE(FluxSingleTransformerBlock);

}  // namespace remat::models
