#pragma once
/// \file
/// The CLIP ViT-L/14 text tower that Flux.1 uses for its pooled prompt embedding
/// (transformers' CLIPTextModel, `text_encoder/` of a diffusers Flux folder), with transformers'
/// state-dict keys so a published `model.safetensors` loads without renaming. See docs/CLIP.md.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "remat/compat.h"
#include "remat/export.h"
#include "remat/models/layers.h"

namespace remat::encoders {

/// `text_encoder/config.json` of transformers' CLIPTextConfig: the fields the text tower reads.
struct REMAT_API ClipTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t max_position_embeddings = 77;
  /// "quick_gelu" (every published CLIP) or "gelu" (the exact erf GELU).
  std::string hidden_act = "quick_gelu";
  double layer_norm_eps = 1e-5;
  int64_t bos_token_id = 0;
  /// Chooses the pooled-token rule (clip_pooled_positions): 2 keeps transformers' legacy rule.
  int64_t eos_token_id = 2;
  int64_t pad_token_id = 1;
  /// Only the …WithProjection classes use it; kept so that to_json() round-trips the file.
  int64_t projection_dim = 768;

  /// FLUX.1's text_encoder: the openai/clip-vit-large-patch14 text tower, with the legacy ids
  /// bos 0, eos 2, pad 1 that its config.json carries.
  static ClipTextConfig clip_l();
  /// A two-layer model (hidden 32) for tests, matching write_tiny_clip_tokenizer's vocabulary:
  /// 732 ids, bos 730, eos = pad = 731.
  static ClipTextConfig tiny();

  /// Parses config.json text. `origin` (a path, or a description) is named in every error.
  /// Absent keys keep clip_l()'s values; unknown keys are ignored (transformers writes many).
  static ClipTextConfig from_json_text(const std::string& text, const std::string& origin);
  /// Reads and parses the file at `path` (bounded size, regular files only).
  static ClipTextConfig from_file(const std::string& path);
  /// transformers-compatible config.json text (with "architectures": ["CLIPTextModel"] and
  /// "model_type": "clip_text_model"); from_json_text(to_json()) gives back the same config.
  std::string to_json() const;

  /// Throws c10::ValueError (naming `origin`) when a field is out of range.
  void validate(const std::string& origin = "ClipTextConfig") const;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

REMAT_API bool operator==(const ClipTextConfig& a, const ClipTextConfig& b);

/// Number of parameters of CLIPTextModel(config), computed from the shapes (allocates nothing):
/// V·D + P·D + L·(4(D²+D) + 4D + 2DF + F + D) + 2D. CLIP-L: 123,060,480.
REMAT_API int64_t parameter_count(const ClipTextConfig& config);

/// The eos_token_id of CLIP configs written before transformers' PR #24773 (FLUX.1's
/// text_encoder/config.json has it): with it, transformers keeps the legacy pooled rule.
inline constexpr int64_t kClipLegacyEosTokenId = 2;

/// The pooled position of each row of `input_ids` (B, L) int64, as transformers'
/// CLIPTextTransformer picks it from the config's eos_token_id: for 2 (kClipLegacyEosTokenId),
/// the first position of each row's largest id (the legacy argmax rule: `<|endoftext|>`, 49407,
/// is the largest id of the published vocabulary); otherwise the first position of
/// `eos_token_id` in each row, 0 for a row without it. Returns (B,) int64.
REMAT_API at::Tensor clip_pooled_positions(const at::Tensor& input_ids, int64_t eos_token_id);

/// What the text tower returns.
struct ClipTextOutput {
  at::Tensor last_hidden_state;  ///< (B, L, D), after final_layer_norm, in the weights' dtype
  at::Tensor pooled_output;      ///< (B, D): last_hidden_state at clip_pooled_positions
};

/// Multi-head self-attention (`self_attn.{q,k,v,out}_proj`) as transformers' eager path computes
/// it: softmax_fp32(q kᵀ · head_dim^-0.5 + mask).to(dtype) · v.
class REMAT_API ClipAttentionImpl : public torch::nn::Module {
 public:
  explicit ClipAttentionImpl(const ClipTextConfig& config);
  /// x (B, L, D); additive_mask broadcastable to (B, H, L, L) in x's dtype, or undefined.
  /// softmax(q k^T / sqrt(d) + mask) v: fused (at::scaled_dot_product_attention, as transformers'
  /// default SDPA path) where LibTorch has it, otherwise transformers' eager formula.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& additive_mask);

  /// Whether forward runs the fused kernel: true where LibTorch has it (2.1+); false computes the
  /// eager formula, what LibTorch 1.13 runs (tests compare the two).
  bool fused_attention = compat::kHasScaledDotProductAttention;

  // remat's Linear (at::linear, bias fused as in PyTorch's nn.Linear): LibTorch's C++
  // torch::nn::Linear adds the bias after a separate matmul for 3-D inputs, which rounds twice
  // in bf16 and does not match transformers.
  models::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};

 private:
  /// The eager formula over heads: q, k, v (B, H, L, d).
  at::Tensor eager_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& additive_mask) const;

  int64_t num_heads_;
  int64_t head_dim_;
};
TORCH_MODULE(ClipAttention);

/// `mlp`: fc2(act(fc1(x))), act = quick_gelu or gelu per config.hidden_act.
class REMAT_API ClipMlpImpl : public torch::nn::Module {
 public:
  explicit ClipMlpImpl(const ClipTextConfig& config);
  at::Tensor forward(const at::Tensor& x);

  models::Linear fc1{nullptr}, fc2{nullptr};

 private:
  bool quick_gelu_;
};
TORCH_MODULE(ClipMlp);

/// One pre-LN layer `encoder.layers.N`: x + attn(LN1(x)), then + mlp(LN2(·)).
class REMAT_API ClipEncoderLayerImpl : public torch::nn::Module {
 public:
  explicit ClipEncoderLayerImpl(const ClipTextConfig& config);
  at::Tensor forward(at::Tensor x, const at::Tensor& additive_mask);

  ClipAttention self_attn{nullptr};
  torch::nn::LayerNorm layer_norm1{nullptr};
  ClipMlp mlp{nullptr};
  torch::nn::LayerNorm layer_norm2{nullptr};
};
TORCH_MODULE(ClipEncoderLayer);

/// The additive causal mask (1, 1, L, L) in `dtype`: 0 where key ≤ query, the dtype's lowest
/// finite value above the diagonal (transformers' convention, so bf16 rounds the same way).
REMAT_API at::Tensor clip_causal_mask(int64_t length, at::ScalarType dtype, const at::Device& device);

/// `embeddings`: token_embedding[ids] + position_embedding[0..L-1].
class REMAT_API ClipTextEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit ClipTextEmbeddingsImpl(const ClipTextConfig& config);
  /// input_ids (B, L) int64 -> (B, L, D) in the weights' dtype.
  at::Tensor forward(const at::Tensor& input_ids);

  torch::nn::Embedding token_embedding{nullptr}, position_embedding{nullptr};
};
TORCH_MODULE(ClipTextEmbeddings);

/// `encoder`: the stack `encoder.layers.N`.
class REMAT_API ClipEncoderImpl : public torch::nn::Module {
 public:
  explicit ClipEncoderImpl(const ClipTextConfig& config);
  at::Tensor forward(at::Tensor x, const at::Tensor& additive_mask);

  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(ClipEncoder);

/// `text_model.*`: embeddings, encoder (causal), final_layer_norm, the pooled token.
class REMAT_API ClipTextTransformerImpl : public torch::nn::Module {
 public:
  explicit ClipTextTransformerImpl(const ClipTextConfig& config);
  ClipTextOutput forward(const at::Tensor& input_ids);

  ClipTextEmbeddings embeddings{nullptr};
  ClipEncoder encoder{nullptr};
  torch::nn::LayerNorm final_layer_norm{nullptr};

 private:
  int64_t eos_token_id_;
};
TORCH_MODULE(ClipTextTransformer);

/// transformers' CLIPTextModel: every key starts with `text_model.`.
class REMAT_API ClipTextModelImpl : public torch::nn::Module {
 public:
  explicit ClipTextModelImpl(const ClipTextConfig& config);
  /// input_ids (B, L) int64 with L ≤ max_position_embeddings and ids in [0, vocab_size).
  /// No padding mask is applied (FluxPipeline passes none; causality hides the padding from the
  /// pooled position). Runs in the weights' dtype and device.
  ClipTextOutput forward(const at::Tensor& input_ids);

  const ClipTextConfig& config() const { return config_; }

  ClipTextTransformer text_model{nullptr};

 private:
  ClipTextConfig config_;
};
TORCH_MODULE(ClipTextModel);

/// Builds ClipTextModel(config) in `dtype` (fp32 or bf16) on CPU and loads `files` (the shards of
/// one checkpoint) strictly: every key of the model must be present with its shape, and no other
/// key may be, except `text_model.embeddings.position_ids` (a buffer old transformers versions
/// saved), which is ignored. A mismatch throws c10::ValueError naming the file(s) and each key.
REMAT_API ClipTextModel load_clip_text_model(const std::vector<std::string>& files,
                                             const ClipTextConfig& config, at::ScalarType dtype);
/// Single-file form.
REMAT_API ClipTextModel load_clip_text_model(const std::string& path, const ClipTextConfig& config,
                                             at::ScalarType dtype);

}  // namespace remat::encoders
