#pragma once
/// \file
/// The language model of Qwen3-VL, the text encoder of MageFlow pipelines: transformers'
/// Qwen3VLTextModel (models/qwen3_vl/modeling_qwen3_vl.py, transformers 5.25) for text alone.
/// Token embeddings, decoder layers (RMSNorm, q/k/v projections with an RMSNorm over each head's
/// q and k, rotary position embedding, causal grouped-query attention, o projection, RMSNorm,
/// SwiGLU MLP), a final RMSNorm; no vision tower, no lm_head. Its output is the final-normed last
/// hidden state, which MageFlow conditions on (SimpleTuner's mageflow/model.py _encode_prompts).
///
/// With text alone Qwen3-VL's multimodal RoPE (mrope_section over T, H and W positions) reduces to
/// the plain 1-D RoPE of the token positions: the three position rows are equal, so
/// Qwen3VLTextRotaryEmbedding.recomposition_frequencies picks the same angles whichever row each
/// frequency comes from.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "remat/export.h"
#include "remat/io/safetensors.h"
#include "remat/models/layers.h"

namespace remat::encoders {

/// The text_config fields of a Qwen3-VL config.json (transformers' Qwen3VLTextConfig) that define
/// the language model. Defaults: Qwen3-VL-4B's.
struct REMAT_API Qwen3TextConfig {
  int64_t vocab_size = 151936;
  int64_t hidden_size = 2560;
  int64_t intermediate_size = 9728;
  int64_t num_hidden_layers = 36;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 128;
  double rms_norm_eps = 1e-6;
  double rope_theta = 5000000.0;
  bool attention_bias = false;

  /// Throws c10::ValueError naming the first invalid field: sizes >= 1, num_key_value_heads
  /// dividing num_attention_heads, head_dim even, eps and theta > 0.
  void validate() const;

  /// Reads a config.json: a Qwen3-VL one (its nested "text_config"; rope_theta from
  /// "rope_parameters" or "rope_scaling" or the top level, as transformers reads them) or a plain
  /// Qwen3 one (the fields at the top level). hidden_act must be "silu" and rope_type "default"
  /// (or absent); anything else is refused by name. Unknown keys are ignored. Throws naming the
  /// file and the key.
  static Qwen3TextConfig from_json_file(const std::string& path);
  static Qwen3TextConfig from_json_text(const std::string& json);

  /// The language model's parameters, from the shapes alone (embeddings included).
  int64_t parameter_count() const;
};

/// Qwen3VLTextRMSNorm (x * rsqrt(mean(x^2) + eps) in float32, cast back to the input dtype, times
/// the weight) is models::RMSNorm wherever the weight has the activations' dtype, as it does here.
using Qwen3RMSNorm = models::RMSNorm;

/// Qwen3VLTextAttention: keys q_proj, k_proj, v_proj, o_proj (biases only with attention_bias),
/// q_norm and k_norm (head_dim).
class REMAT_API Qwen3AttentionImpl : public torch::nn::Module {
 public:
  explicit Qwen3AttentionImpl(const Qwen3TextConfig& config);
  /// x (B, L, D); cos and sin (L, head_dim) in x's dtype (rotate_half layout: the angles twice);
  /// causal (L, L) boolean, true where a query may attend.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& causal);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  Qwen3RMSNorm q_norm{nullptr}, k_norm{nullptr};

 private:
  int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(Qwen3Attention);

/// Qwen3VLTextMLP: down_proj(silu(gate_proj(x)) * up_proj(x)), no biases.
class REMAT_API Qwen3MlpImpl : public torch::nn::Module {
 public:
  explicit Qwen3MlpImpl(const Qwen3TextConfig& config);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Qwen3Mlp);

/// Qwen3VLTextDecoderLayer: pre-norm attention and MLP, each added to the residual stream. Keys
/// input_layernorm, self_attn, post_attention_layernorm, mlp.
class REMAT_API Qwen3DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit Qwen3DecoderLayerImpl(const Qwen3TextConfig& config);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& causal);
  Qwen3RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Qwen3Attention self_attn{nullptr};
  Qwen3Mlp mlp{nullptr};
};
TORCH_MODULE(Qwen3DecoderLayer);

/// The language model: keys embed_tokens, layers.{i}, norm (Qwen3VLTextModel's; in a Qwen3-VL
/// checkpoint they are under "model.language_model.").
class REMAT_API Qwen3TextModelImpl : public torch::nn::Module {
 public:
  explicit Qwen3TextModelImpl(Qwen3TextConfig config);
  /// input_ids (B, L) int64 in [0, vocab_size), every sequence unpadded (positions 0 .. L-1,
  /// causal attention). Returns the final-normed last hidden state (B, L, hidden_size) in the
  /// model's dtype. Throws c10::ValueError for ids out of range or a wrong shape.
  at::Tensor forward(const at::Tensor& input_ids);
  const Qwen3TextConfig& config() const { return config_; }

  torch::nn::Embedding embed_tokens{nullptr};
  std::vector<Qwen3DecoderLayer> layers;
  Qwen3RMSNorm norm{nullptr};

 private:
  Qwen3TextConfig config_;
};
TORCH_MODULE(Qwen3TextModel);

/// The rotary tables of positions 0 .. length-1 as Qwen3VLTextRotaryEmbedding makes them for text:
/// inv_freq = 1 / theta^(arange(0, head_dim, 2) / head_dim) in float32, angles = position x inv_freq
/// in float32, cos and sin of the angles twice over (rotate_half layout), cast to `dtype`.
/// Returns {cos, sin}, each (length, head_dim).
REMAT_API std::pair<at::Tensor, at::Tensor> qwen3_rope_tables(int64_t length, int64_t head_dim, double theta,
                                                              at::ScalarType dtype);

/// The key prefix of the language model in a Qwen3-VL checkpoint (transformers 5's layout).
inline constexpr const char* kQwen3VlLanguageModelPrefix = "model.language_model.";

/// Builds the model directly in `dtype` (no float32 copy of a bfloat16 model) and loads it strictly
/// from `files`: keys under kQwen3VlLanguageModelPrefix (or, for a plain Qwen3 checkpoint, under
/// "model."), every other key (the vision tower "model.visual.*", "lm_head.*") ignored. Each tensor
/// is converted from the mapping into its destination's dtype. Throws naming the missing,
/// unexpected or mis-shaped keys and their files.
REMAT_API Qwen3TextModel load_qwen3_text_model(const std::vector<io::SafetensorsFile>& files,
                                               const Qwen3TextConfig& config, at::ScalarType dtype);

}  // namespace remat::encoders
