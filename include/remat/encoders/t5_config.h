#pragma once
/// \file
/// The configuration of a T5 encoder as transformers' T5Config writes it (`text_encoder_2/config.json`
/// of a Flux pipeline folder), and the parameter count it implies. docs/T5.md describes the model.

#include <cstdint>
#include <string>

#include "remat/export.h"

namespace remat::encoders {

/// T5 / T5 v1.1 encoder hyper-parameters, named as in transformers' config.json.
///
/// `feed_forward_proj` is "ACT" or "gated-ACT" (ACT one of relu, gelu, gelu_new); as in
/// transformers it sets `dense_act_fn` = ACT and `is_gated_act`, except that "gated-gelu" means
/// gelu_new (transformers' backward-compatibility rule, which T5 v1.1 and Flux rely on). Explicit
/// `dense_act_fn` / `is_gated_act` keys in a file override the derived values, as they do in
/// transformers (PretrainedConfig stores leftover keys after T5Config derives its own).
struct REMAT_API T5Config {
  int64_t vocab_size = 32128;                     ///< embedding rows (tokenizer ids + padding)
  int64_t d_model = 512;                          ///< hidden size D
  int64_t d_kv = 64;                              ///< per-head width
  int64_t d_ff = 2048;                            ///< feed-forward width F
  int64_t num_layers = 6;                         ///< encoder blocks
  int64_t num_decoder_layers = 6;                 ///< kept for to_json only (no decoder here)
  int64_t num_heads = 8;                          ///< attention heads H
  int64_t relative_attention_num_buckets = 32;    ///< rows of the relative position bias
  int64_t relative_attention_max_distance = 128;  ///< distance mapped to the last bucket
  double layer_norm_epsilon = 1e-6;               ///< RMS norm epsilon
  double dropout_rate = 0.1;                      ///< kept for to_json (inference: identity)
  std::string feed_forward_proj = "relu";         ///< "relu", "gated-gelu", ...
  std::string dense_act_fn = "relu";              ///< relu | gelu | gelu_new (derived)
  bool is_gated_act = false;                      ///< wi_0/wi_1 (gated) or wi (derived)
  int64_t pad_token_id = 0;
  int64_t eos_token_id = 1;

  /// H * d_kv, the width of q, k and v.
  int64_t inner_dim() const { return num_heads * d_kv; }

  /// Throws remat::throw_value_error ("[t5] ...") naming the field and its valid range.
  void validate() const;

  /// Parses config.json text (bounded JSON policy). `source` names the file in messages.
  /// Unknown keys are labels and ignored; a wrong type or an invalid value names the key.
  static T5Config from_json_text(const std::string& json, const std::string& source = "config JSON");

  /// Reads and parses a config.json file; messages name `path`.
  static T5Config from_file(const std::string& path);

  /// transformers-compatible config.json text ("architectures": ["T5EncoderModel"],
  /// "model_type": "t5"); from_json_text(to_json()) gives back an equal config.
  std::string to_json() const;

  /// google/t5-v1_1-xxl, Flux.1's text_encoder_2: 32128 x 4096, 24 layers of 64 heads x 64,
  /// d_ff 10240, 32 buckets up to distance 128, eps 1e-6, gated-gelu.
  static T5Config t5_v1_1_xxl();

  /// A 2-layer, 32-wide gated-gelu model with the XXL structure, for tests (27,680 parameters).
  static T5Config tiny();

  /// Splits feed_forward_proj into dense_act_fn and is_gated_act as transformers does; throws
  /// a "[t5] feed_forward_proj ..." message listing the valid forms for anything else.
  void derive_activation();
};

REMAT_API bool operator==(const T5Config& a, const T5Config& b);

/// Number of parameters of the encoder (the shared embedding counted once, no decoder), from the
/// config alone: V*D + L*(4*D*H*dk + (3 or 2)*D*F + 2*D) + buckets*H + D.
/// T5 v1.1 XXL: 4,762,310,656.
REMAT_API int64_t parameter_count(const T5Config& config);

}  // namespace remat::encoders
