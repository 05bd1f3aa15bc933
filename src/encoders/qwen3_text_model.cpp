// Qwen3-VL's language model (remat/encoders/qwen3_text_model.h), written from transformers 5.25's
// models/qwen3_vl/modeling_qwen3_vl.py: Qwen3VLTextRMSNorm, Qwen3VLTextRotaryEmbedding (text
// positions), apply_rotary_pos_emb / rotate_half, Qwen3VLTextAttention (q_norm / k_norm on each
// head before RoPE, repeat_kv for grouped-query attention, scaling head_dim^-0.5, causal),
// Qwen3VLTextMLP, Qwen3VLTextDecoderLayer and Qwen3VLTextModel.forward; and configuration_qwen3_vl.py
// for the config.
#include "remat/encoders/qwen3_text_model.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "config_json.h"
#include "remat/compat.h"
#include "remat/default_dtype.h"
#include "remat/util/error.h"

namespace remat::encoders {
namespace {

constexpr const char* kComponent = "qwen3";

// The keys of transformers' Qwen3VLTextConfig that shape the language model (Note [Config fields]
// in config_json.h); rope_theta and the activation are read by hand.
constexpr auto qwen3_fields = [](auto& c, auto&& field) {
  field("vocab_size", c.vocab_size);
  field("hidden_size", c.hidden_size);
  field("intermediate_size", c.intermediate_size);
  field("num_hidden_layers", c.num_hidden_layers);
  field("num_attention_heads", c.num_attention_heads);
  field("num_key_value_heads", c.num_key_value_heads);
  field("head_dim", c.head_dim);
  field("rms_norm_eps", c.rms_norm_eps);
  field("attention_bias", c.attention_bias);
};

// Upper bounds, checked before anything is built: the largest Qwen3 models (235B: hidden 4096,
// 94 layers, 64 heads; vocabulary 151936) with a wide margin.
void check_range(int64_t value, int64_t bound, const char* key) {
  if (value < 1 || value > bound) {
    throw_value_error(std::string("[qwen3] ") + key + " must be in [1, " + std::to_string(bound) + "], got " +
                      std::to_string(value));
  }
}

// transformers' rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the last dimension.
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

void Qwen3TextConfig::validate() const {
  check_range(vocab_size, 1 << 22, "vocab_size");
  check_range(hidden_size, 65536, "hidden_size");
  check_range(intermediate_size, 1 << 20, "intermediate_size");
  check_range(num_hidden_layers, 1024, "num_hidden_layers");
  check_range(num_attention_heads, 1024, "num_attention_heads");
  check_range(num_key_value_heads, 1024, "num_key_value_heads");
  check_range(head_dim, 4096, "head_dim");
  if (num_attention_heads % num_key_value_heads != 0) {
    throw_value_error("[qwen3] num_key_value_heads (" + std::to_string(num_key_value_heads) +
                      ") must divide num_attention_heads (" + std::to_string(num_attention_heads) + ")");
  }
  if (head_dim % 2 != 0) throw_value_error("[qwen3] head_dim must be even (RoPE rotates halves), got " + std::to_string(head_dim));
  if (!(rms_norm_eps > 0)) throw_value_error("[qwen3] rms_norm_eps must be above 0, got " + std::to_string(rms_norm_eps));
  if (!(rope_theta > 0)) throw_value_error("[qwen3] rope_theta must be above 0, got " + std::to_string(rope_theta));
}

Qwen3TextConfig Qwen3TextConfig::from_json_text(const std::string& json) {
  const auto top = remat::detail::parse_config_json(json, kComponent);
  // Qwen3-VL nests the language model's fields in text_config; a plain Qwen3 has them at the top.
  const auto nested = top.find("text_config");
  if (nested != top.end() && !nested->is_null() && !nested->is_object()) {
    throw_value_error("[qwen3] config key 'text_config' must be an object, got " + util::json_excerpt(*nested));
  }
  const nlohmann::json& j = nested != top.end() && nested->is_object() ? *nested : top;
  Qwen3TextConfig c;
  const remat::detail::ConfigFieldReader field(j, "[qwen3] ");
  qwen3_fields(c, field);  // head_dim keeps the configs' default, 128, when absent
  std::string act = "silu";
  field("hidden_act", act);
  if (act != "silu") {
    throw_value_error("[qwen3] hidden_act '" + act + "' is not supported; Qwen3's language model uses silu");
  }
  // transformers 5 keeps RoPE in rope_parameters (older files: rope_scaling, or rope_theta at the top).
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) throw_value_error(std::string("[qwen3] config key '") + key + "' must be an object");
    const remat::detail::ConfigFieldReader rope(*it, std::string("[qwen3] ") + key + ": ");
    rope("rope_theta", c.rope_theta);
    std::string type = "default";
    rope("rope_type", type);
    if (type != "default" && !(type == "mrope" || it->contains("mrope_section"))) {
      throw_value_error(std::string("[qwen3] ") + key + ".rope_type '" + type +
                        "' is not supported; remat implements the default RoPE (Qwen3-VL's multimodal RoPE "
                        "is the same for text)");
    }
  }
  field("rope_theta", c.rope_theta);
  c.validate();
  return c;
}

Qwen3TextConfig Qwen3TextConfig::from_json_file(const std::string& path) {
  // The file's path goes into every message (remat::detail::parse_config_file).
  return remat::detail::parse_config_file(path, kComponent, [](const std::string& text) { return from_json_text(text); });
}

int64_t Qwen3TextConfig::parameter_count() const {
  const int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  int64_t attention = hidden_size * q + 2 * hidden_size * kv + q * hidden_size + 2 * head_dim;
  if (attention_bias) attention += q + 2 * kv + hidden_size;
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  const int64_t layer = attention + mlp + 2 * hidden_size;
  return vocab_size * hidden_size + num_hidden_layers * layer + hidden_size;
}

Qwen3AttentionImpl::Qwen3AttentionImpl(const Qwen3TextConfig& c)
    : heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.head_dim) {
  const auto linear = [&](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(c.attention_bias));
  };
  q_proj = register_module("q_proj", linear(c.hidden_size, heads_ * head_dim_));
  k_proj = register_module("k_proj", linear(c.hidden_size, kv_heads_ * head_dim_));
  v_proj = register_module("v_proj", linear(c.hidden_size, kv_heads_ * head_dim_));
  o_proj = register_module("o_proj", linear(heads_ * head_dim_, c.hidden_size));
  q_norm = register_module("q_norm", Qwen3RMSNorm(head_dim_, c.rms_norm_eps));
  k_norm = register_module("k_norm", Qwen3RMSNorm(head_dim_, c.rms_norm_eps));
}

at::Tensor Qwen3AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                       const at::Tensor& causal) {
  const int64_t B = x.size(0), L = x.size(1);
  // (B, L, H, d) -> normed per head -> (B, H, L, d).
  const auto heads_of = [&](const at::Tensor& t, int64_t h) { return t.view({B, L, h, head_dim_}); };
  at::Tensor q = q_norm->forward(heads_of(q_proj->forward(x), heads_)).transpose(1, 2);
  at::Tensor k = k_norm->forward(heads_of(k_proj->forward(x), kv_heads_)).transpose(1, 2);
  at::Tensor v = heads_of(v_proj->forward(x), kv_heads_).transpose(1, 2);
  // apply_rotary_pos_emb: cos/sin (L, d) broadcast over batch and heads, in the activations' dtype.
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  // repeat_kv: query head h reads key/value head h / (heads / kv_heads).
  if (kv_heads_ != heads_) {
    const int64_t n_rep = heads_ / kv_heads_;
    k = k.unsqueeze(2).expand({B, kv_heads_, n_rep, L, head_dim_}).reshape({B, heads_, L, head_dim_});
    v = v.unsqueeze(2).expand({B, kv_heads_, n_rep, L, head_dim_}).reshape({B, heads_, L, head_dim_});
  }
  at::Tensor out = compat::scaled_dot_product_attention(q, k, v, causal, 1.0 / std::sqrt(static_cast<double>(head_dim_)));
  return o_proj->forward(out.transpose(1, 2).reshape({B, L, heads_ * head_dim_}));
}

Qwen3MlpImpl::Qwen3MlpImpl(const Qwen3TextConfig& c) {
  const auto linear = [](int64_t in, int64_t out) { return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)); };
  gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size));
  up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size));
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size));
}

at::Tensor Qwen3MlpImpl::forward(const at::Tensor& x) {
  return down_proj->forward(at::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

Qwen3DecoderLayerImpl::Qwen3DecoderLayerImpl(const Qwen3TextConfig& c) {
  self_attn = register_module("self_attn", Qwen3Attention(c));
  mlp = register_module("mlp", Qwen3Mlp(c));
  input_layernorm = register_module("input_layernorm", Qwen3RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", Qwen3RMSNorm(c.hidden_size, c.rms_norm_eps));
}

at::Tensor Qwen3DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                          const at::Tensor& causal) {
  const at::Tensor h = x + self_attn->forward(input_layernorm->forward(x), cos, sin, causal);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

std::pair<at::Tensor, at::Tensor> qwen3_rope_tables(int64_t length, int64_t head_dim, double theta,
                                                    at::ScalarType dtype) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)): a float32 power of a
  // Python float base, as torch computes it.
  const at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0, head_dim, 2, f32) / static_cast<double>(head_dim));
  const at::Tensor angles = at::arange(length, f32).unsqueeze(1) * inv_freq.unsqueeze(0);
  const at::Tensor twice = at::cat({angles, angles}, -1);
  return {twice.cos().to(dtype), twice.sin().to(dtype)};
}

Qwen3TextModelImpl::Qwen3TextModelImpl(Qwen3TextConfig config) : config_(std::move(config)) {
  config_.validate();
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(config_.vocab_size, config_.hidden_size));
  auto list = torch::nn::ModuleList();
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    layers.push_back(Qwen3DecoderLayer(config_));
    list->push_back(layers.back());
  }
  register_module("layers", list);
  norm = register_module("norm", Qwen3RMSNorm(config_.hidden_size, config_.rms_norm_eps));
}

at::Tensor Qwen3TextModelImpl::forward(const at::Tensor& input_ids) {
  if (input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong || input_ids.size(1) < 1) {
    throw_value_error("[qwen3] input_ids must be (B, L) int64 with L >= 1, got " + c10::str(input_ids.sizes()) + " " +
                      c10::toString(input_ids.scalar_type()));
  }
  const int64_t lo = input_ids.min().item<int64_t>(), hi = input_ids.max().item<int64_t>();
  if (lo < 0 || hi >= config_.vocab_size) {
    throw_value_error("[qwen3] token ids must be in [0, " + std::to_string(config_.vocab_size) + "), got " +
                      std::to_string(lo < 0 ? lo : hi));
  }
  at::Tensor h = embed_tokens->forward(input_ids);
  const auto [cos, sin] = qwen3_rope_tables(input_ids.size(1), config_.head_dim, config_.rope_theta, h.scalar_type());
  const at::Tensor c = cos.to(h.device()), s = sin.to(h.device());
  const int64_t L = input_ids.size(1);
  const at::Tensor causal = torch::ones({L, L}, at::TensorOptions().dtype(at::kBool).device(h.device())).tril();
  for (auto& layer : layers) h = layer->forward(h, c, s, causal);
  return norm->forward(h);
}

Qwen3TextModel load_qwen3_text_model(const std::vector<io::SafetensorsFile>& files, const Qwen3TextConfig& config,
                                     at::ScalarType dtype) {
  config.validate();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kDouble) {
    throw_value_error(std::string("[qwen3] dtype must be float32, bfloat16 or float64, got ") + c10::toString(dtype));
  }
  if (files.empty()) throw_value_error("[qwen3] load_qwen3_text_model needs at least one safetensors file");
  // Qwen3-VL (transformers 5): model.language_model.*; a plain Qwen3 causal LM: model.*.
  std::string prefix = "model.";
  for (const auto& f : files) {
    for (const auto& key : f.names()) {
      if (key.rfind(kQwen3VlLanguageModelPrefix, 0) == 0) prefix = kQwen3VlLanguageModelPrefix;
    }
  }
  Qwen3TextModel model{nullptr};
  {
    DefaultDtypeGuard guard(dtype);  // built in its dtype: a bfloat16 model never has a float32 copy
    model = Qwen3TextModel(config);
  }
  io::LoadOptions options;
  options.strip_prefix = prefix;
  const bool vl = prefix == kQwen3VlLanguageModelPrefix;
  options.key_filter = [prefix, vl](const std::string& key) {
    // The vision tower and lm_head are not part of the text encoder.
    if (vl) return key.rfind(prefix, 0) == 0;
    return key.rfind(prefix, 0) == 0 && key.rfind("model.visual.", 0) != 0;
  };
  torch::NoGradGuard no_grad;
  io::load_state_dict_into(*model, files, options);
  model->eval();
  return model;
}

}  // namespace remat::encoders
