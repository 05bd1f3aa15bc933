#pragma once
/// \file
/// The T5 (v1.1) encoder of Flux.1's text_encoder_2, with transformers' T5EncoderModel key names,
/// so a published `model*.safetensors` loads without remapping. docs/T5.md describes the numerics.

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "remat/compat.h"
#include "remat/encoders/t5_config.h"
#include "remat/export.h"
#include "remat/io/safetensors.h"

namespace remat::encoders {

/// The longest T5 prompt Flux.1-dev and Flux.1-schnell use (BFL's reference; diffusers' default
/// max_sequence_length is 512 for both). SimpleTuner calls this --tokenizer_max_length.
constexpr int64_t kT5MaxLengthDev = 512;
constexpr int64_t kT5MaxLengthSchnell = 256;

/// transformers' T5Attention._relative_position_bucket: maps relative positions (memory minus
/// query position, int64 of any shape) to bucket ids (int64, same shape). Bidirectional (the
/// encoder): half the buckets for positive distances; within each half, distances below
/// num_buckets/4 get their own bucket and larger ones share log-spaced buckets up to
/// max_distance. Computed with the same float32 logarithm as upstream, so ids match exactly.
REMAT_API at::Tensor relative_position_bucket(const at::Tensor& relative_position, bool bidirectional,
                                              int64_t num_buckets, int64_t max_distance);

/// transformers' fp16 overflow guard on the residual stream (T5Block, after each sub-layer):
/// for fp16 `h`, clamp to +-65504, or to +-64504 when `h` already holds an inf; any other dtype
/// is returned unchanged (bf16 has fp32's range). NaNs are not touched.
REMAT_API at::Tensor clamp_fp16_residual(const at::Tensor& h);

/// T5LayerNorm, an RMS norm without mean or bias: y = weight * x / sqrt(mean(x^2) + eps).
/// The mean of squares is taken in fp32 (fp64 for fp64 input); the normalised value is rounded
/// to the weight's dtype when that is fp16/bf16 before the multiplication, as upstream does.
class REMAT_API T5LayerNormImpl : public torch::nn::Module {
 public:
  T5LayerNormImpl(int64_t hidden_size, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;  ///< (D), key `weight`

 private:
  double eps_;
};
TORCH_MODULE(T5LayerNorm);

/// T5 self-attention without the 1/sqrt(d_kv) scaling (folded into the initialisation by
/// Mesh-TF). Keys q, k, v (inner x D), o (D x inner), no biases; relative_attention_bias
/// (buckets x H) only when `has_relative_attention_bias` (block 0 of the encoder).
class REMAT_API T5AttentionImpl : public torch::nn::Module {
 public:
  T5AttentionImpl(const T5Config& config, bool has_relative_attention_bias);

  /// The position bias (1, H, Lq, Lk) in the weight's dtype (needs the bias table).
  at::Tensor compute_bias(int64_t query_length, int64_t key_length);

  /// x (B, L, D), position_bias (1 or B, H, L or 1, L) -> (B, L, D): softmax(q k^T +
  /// position_bias) v, unscaled. Fused (at::scaled_dot_product_attention with the bias as its
  /// additive mask and scale 1, as transformers' default SDPA path runs it) where LibTorch has it;
  /// otherwise the formula of transformers' eager path (scores rounded to their dtype, softmax in
  /// fp32, rounded back), a chunk of queries at a time.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& position_bias);

  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  torch::nn::Embedding relative_attention_bias{nullptr};
  /// Whether forward runs the fused kernel: true where LibTorch has it (2.1+). false computes the
  /// formula in query chunks, what LibTorch 1.13 runs (tests compare the two).
  bool fused_attention = compat::kHasScaledDotProductAttention;
  /// The formula's queries per chunk of the scores; 0 (the default): as many as fit 16 MiB of fp32
  /// scores.
  int64_t query_chunk = 0;

 private:
  /// The formula over heads: qh (B, H, L, dk), kt (B, H, dk, Lk), vh (B, H, Lk, dk).
  at::Tensor attend_in_query_chunks(const at::Tensor& qh, const at::Tensor& kt, const at::Tensor& vh,
                                    const at::Tensor& position_bias) const;

  T5Config config_;
};
TORCH_MODULE(T5Attention);

/// T5DenseActDense / T5DenseGatedActDense: wo(act(wi x)) or wo(act(wi_0 x) * wi_1 x). When wo
/// has another dtype than the activations (wo kept in fp32 for an fp16 model), the activations
/// are cast to wo's dtype first, as upstream does.
class REMAT_API T5DenseReluDenseImpl : public torch::nn::Module {
 public:
  explicit T5DenseReluDenseImpl(const T5Config& config);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear wi{nullptr}, wi_0{nullptr}, wi_1{nullptr}, wo{nullptr};

 private:
  T5Config config_;
};
TORCH_MODULE(T5DenseReluDense);

/// One encoder block: h += SelfAttention(layer_norm(h)) (layer.0), then
/// h += DenseReluDense(layer_norm(h)) (layer.1), with upstream's fp16 clamp after each.
class REMAT_API T5BlockImpl : public torch::nn::Module {
 public:
  T5BlockImpl(const T5Config& config, bool has_relative_attention_bias);
  /// h by value: given the only reference, the block frees it once its first sum exists.
  at::Tensor forward(at::Tensor h, const at::Tensor& position_bias);

  T5Attention self_attention{nullptr};
  T5LayerNorm attention_norm{nullptr};
  T5DenseReluDense dense_relu_dense{nullptr};
  T5LayerNorm ff_norm{nullptr};
};
TORCH_MODULE(T5Block);

/// The encoder stack (`encoder.*`): blocks and the final norm. The token embedding lives in
/// T5EncoderModel as `shared`, which upstream also reaches as `encoder.embed_tokens`.
class REMAT_API T5StackImpl : public torch::nn::Module {
 public:
  explicit T5StackImpl(const T5Config& config);
  torch::nn::ModuleList block{nullptr};
  T5LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(T5Stack);

/// transformers' T5EncoderModel: shared token embedding, encoder stack, final norm.
///
/// Keys: `shared.weight` (V, D); per block N `encoder.block.N.layer.0.SelfAttention.{q,k,v,o}.weight`,
/// `encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight` (block 0 only),
/// `encoder.block.N.layer.0.layer_norm.weight`, `encoder.block.N.layer.1.DenseReluDense.{wi_0,wi_1,wo}.weight`
/// (or `wi` when not gated), `encoder.block.N.layer.1.layer_norm.weight`; `encoder.final_layer_norm.weight`.
class REMAT_API T5EncoderModelImpl : public torch::nn::Module {
 public:
  explicit T5EncoderModelImpl(T5Config config);

  /// input_ids (B, L) int64 in [0, vocab_size); attention_mask (B, L) of 0/1 (any dtype) or
  /// undefined (attend everywhere, as FluxPipeline calls it) -> last_hidden_state (B, L, D) in
  /// the embedding's dtype. Masked keys get finfo(dtype).min added to their scores.
  /// The relative position bias is computed once (block 0's table) and shared by every block.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {});

  const T5Config& config() const { return config_; }

  torch::nn::Embedding shared{nullptr};
  T5Stack encoder{nullptr};

 private:
  T5Config config_;
};
TORCH_MODULE(T5EncoderModel);

/// Builds a T5EncoderModel in `dtype` and loads `files` (one file or the shards of one
/// checkpoint) strictly: every key of the model must be present exactly once, and no other key
/// is allowed except `decoder.*` and `lm_head.*` (a full T5 checkpoint; ignored, as upstream's
/// T5EncoderModel ignores them). The embedding may be stored as `shared.weight` or
/// `encoder.embed_tokens.weight` (the same tensor upstream); when both are present
/// `shared.weight` is used. For fp16, the `wo` weights stay fp32 as transformers'
/// `_keep_in_fp32_modules = ["wo"]` keeps them (bf16 and fp32: every tensor in `dtype`).
/// The model is built directly in `dtype` (no fp32 copy of the weights is ever held; LibTorch's
/// default dtype is switched while the modules are constructed, so do not construct modules on
/// other threads meanwhile). Errors (remat::throw_value_error, "[t5] ...") name the files and the
/// offending keys.
REMAT_API T5EncoderModel load_t5_encoder(const std::vector<io::SafetensorsFile>& files,
                                         const T5Config& config, at::ScalarType dtype);

}  // namespace remat::encoders
