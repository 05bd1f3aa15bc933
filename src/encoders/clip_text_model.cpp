// CLIPTextModel in LibTorch, ported from transformers' models/clip/modeling_clip.py
// (CLIPTextEmbeddings, CLIPAttention with eager_attention_forward, CLIPMLP, CLIPEncoderLayer,
// CLIPTextTransformer). Attention runs transformers' default, SDPA, where LibTorch has the fused
// kernel; elsewhere the op order follows the eager path so that bf16 rounds as upstream's did.

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "remat/default_dtype.h"
#include "remat/encoders/activations.h"
#include "remat/encoders/clip_text_model.h"
#include "remat/util/error.h"
#include "remat/io/safetensors.h"
#include "python_number.h"

namespace remat::encoders {

ClipAttentionImpl::ClipAttentionImpl(const ClipTextConfig& config)
    : num_heads_(config.num_attention_heads), head_dim_(config.head_dim()) {
  const int64_t D = config.hidden_size;
  // Registered in transformers' order (k, v, q, out) so that module_state() lists keys the same way.
  k_proj = register_module("k_proj", models::Linear(D, D));
  v_proj = register_module("v_proj", models::Linear(D, D));
  q_proj = register_module("q_proj", models::Linear(D, D));
  out_proj = register_module("out_proj", models::Linear(D, D));
}

at::Tensor ClipAttentionImpl::forward(const at::Tensor& x, const at::Tensor& additive_mask) {
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
  auto heads = [&](const at::Tensor& t) { return t.view({B, L, num_heads_, head_dim_}).transpose(1, 2); };
  at::Tensor out;
  if (fused_attention) {
    // transformers' sdpa_attention_forward (integrations/sdpa_attention.py, the default since 5.0)
    // with CLIPAttention's scale, head_dim ** -0.5; the causal mask as the additive mask (upstream
    // passes is_causal instead when there is no padding mask: the same weights, exp of the masked
    // entries is exactly 0 either way). The scores stay in fp32 inside the kernel.
    const c10::optional<at::Tensor> mask =
        additive_mask.defined() ? c10::optional<at::Tensor>(additive_mask) : c10::nullopt;
    out = compat::scaled_dot_product_attention(heads(q_proj(x)), heads(k_proj(x)), heads(v_proj(x)), mask,
                                               1.0 / std::sqrt(static_cast<double>(head_dim_)));
  } else {
    out = eager_attention(heads(q_proj(x)), heads(k_proj(x)), heads(v_proj(x)), additive_mask);
  }
  return out_proj(out.transpose(1, 2).reshape({B, L, D}));
}

at::Tensor ClipAttentionImpl::eager_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& additive_mask) const {
  // transformers' eager_attention_forward (models/clip/modeling_clip.py): the scale multiplies the
  // product, not q; the mask is added; the softmax runs in fp32 and is cast back before the
  // product with v. Each intermediate is dropped as soon as the next exists: q and k with the
  // scores, the scores with the softmax, the softmax with its product with v. The scale and the
  // mask are applied in place (the product is not saved for backward by matmul, nor by either
  // op; the scale as Python passes it, see python_number.h).
  at::Tensor weights;
  {
    at::Tensor scores = at::matmul(q, k.transpose(-1, -2));
    scores.mul_(detail::python_number(1.0 / std::sqrt(static_cast<double>(head_dim_))));
    if (additive_mask.defined()) scores.add_(additive_mask);
    weights = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  }
  return at::matmul(weights, v);
}

ClipMlpImpl::ClipMlpImpl(const ClipTextConfig& config) : quick_gelu_(config.hidden_act == "quick_gelu") {
  fc1 = register_module("fc1", models::Linear(config.hidden_size, config.intermediate_size));
  fc2 = register_module("fc2", models::Linear(config.intermediate_size, config.hidden_size));
}

at::Tensor ClipMlpImpl::forward(const at::Tensor& x) {
  // fc1's output is handed to the activation, which frees it (or computes in it) before fc2.
  at::Tensor h = quick_gelu_ ? quick_gelu_consuming(fc1(x)) : at::gelu(fc1(x));
  return fc2(h);
}

ClipEncoderLayerImpl::ClipEncoderLayerImpl(const ClipTextConfig& config) {
  const auto norm = torch::nn::LayerNormOptions({config.hidden_size}).eps(config.layer_norm_eps);
  self_attn = register_module("self_attn", ClipAttention(config));
  layer_norm1 = register_module("layer_norm1", torch::nn::LayerNorm(norm));
  mlp = register_module("mlp", ClipMlp(config));
  layer_norm2 = register_module("layer_norm2", torch::nn::LayerNorm(norm));
}

at::Tensor ClipEncoderLayerImpl::forward(at::Tensor x, const at::Tensor& additive_mask) {
  // The residual sums go into the branch outputs (new tensors that nothing saves for backward), so
  // no third activation is allocated; x + a and a + x round alike. Given the only reference to x
  // (ClipEncoderImpl moves it in), the layer frees it once the first sum holds it.
  at::Tensor h = self_attn->forward(layer_norm1(x), additive_mask);
  h.add_(x);
  x.reset();
  at::Tensor out = mlp->forward(layer_norm2(h));
  return out.add_(h);
}

at::Tensor clip_causal_mask(int64_t length, at::ScalarType dtype, const at::Device& device) {
  // transformers fills the masked entries with torch.finfo(dtype).min rather than -inf, so a row
  // can never be all -inf; exp() of it underflows to exactly 0 either way.
  const double lowest = at::kBFloat16 == dtype ? static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest())
                        : at::kHalf == dtype   ? static_cast<double>(std::numeric_limits<c10::Half>::lowest())
                        : at::kDouble == dtype ? std::numeric_limits<double>::lowest()
                                               : static_cast<double>(std::numeric_limits<float>::lowest());
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  const at::Tensor upper = at::ones({length, length}, options.dtype(at::kBool)).triu(1);
  return at::zeros({length, length}, options).masked_fill(upper, lowest).view({1, 1, length, length});
}

ClipTextEmbeddingsImpl::ClipTextEmbeddingsImpl(const ClipTextConfig& config) {
  token_embedding = register_module("token_embedding", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  position_embedding = register_module(
      "position_embedding", torch::nn::Embedding(config.max_position_embeddings, config.hidden_size));
}

at::Tensor ClipTextEmbeddingsImpl::forward(const at::Tensor& input_ids) {
  const int64_t L = input_ids.size(-1);
  const at::Tensor positions = at::arange(L, input_ids.options().dtype(at::kLong)).unsqueeze(0);
  return token_embedding(input_ids) + position_embedding(positions);
}

ClipEncoderImpl::ClipEncoderImpl(const ClipTextConfig& config) {
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(ClipEncoderLayer(config));
}

at::Tensor ClipEncoderImpl::forward(at::Tensor x, const at::Tensor& additive_mask) {
  for (const auto& layer : *layers) x = layer->as<ClipEncoderLayerImpl>()->forward(std::move(x), additive_mask);
  return x;
}

at::Tensor clip_pooled_positions(const at::Tensor& input_ids, int64_t eos_token_id) {
  TORCH_CHECK_VALUE(input_ids.dim() == 2 && input_ids.size(1) > 0,
                    "[clip] input_ids must be (B, L) with L >= 1, got ", input_ids.sizes());
  // transformers' CLIPTextTransformer.forward (models/clip/modeling_clip.py, since PR #24773):
  // the config decides. eos_token_id 2 (the value configs had before that PR, FLUX.1's included)
  // keeps the legacy rule, the first largest id of each row (the end of text is the largest id of
  // the published vocabulary); any other value takes each row's first eos_token_id. Both are
  // argmax over int32 ids, which picks the first match.
  const at::Tensor ids = input_ids.to(at::kInt);
  if (eos_token_id == kClipLegacyEosTokenId) return ids.argmax(-1);
  return ids.eq(eos_token_id).to(at::kInt).argmax(-1);
}

ClipTextTransformerImpl::ClipTextTransformerImpl(const ClipTextConfig& config)
    : eos_token_id_(config.eos_token_id) {
  embeddings = register_module("embeddings", ClipTextEmbeddings(config));
  encoder = register_module("encoder", ClipEncoder(config));
  final_layer_norm = register_module(
      "final_layer_norm",
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.hidden_size}).eps(config.layer_norm_eps)));
}

ClipTextOutput ClipTextTransformerImpl::forward(const at::Tensor& input_ids) {
  at::Tensor h = embeddings->forward(input_ids);
  const at::Tensor mask = clip_causal_mask(input_ids.size(1), h.scalar_type(), h.device());
  h = final_layer_norm(encoder->forward(std::move(h), mask));
  const at::Tensor rows = at::arange(h.size(0), input_ids.options().dtype(at::kLong));
  const at::Tensor positions = clip_pooled_positions(input_ids, eos_token_id_).to(h.device(), at::kLong);
  return {h, h.index({rows.to(h.device()), positions})};
}

ClipTextModelImpl::ClipTextModelImpl(const ClipTextConfig& config) : config_(config) {
  config_.validate();
  text_model = register_module("text_model", ClipTextTransformer(config_));
}

ClipTextOutput ClipTextModelImpl::forward(const at::Tensor& input_ids) {
  TORCH_CHECK_VALUE(input_ids.dim() == 2, "[clip] input_ids must be (B, L), got ", input_ids.sizes());
  TORCH_CHECK_VALUE(input_ids.scalar_type() == at::kLong, "[clip] input_ids must be int64, got ",
                    input_ids.scalar_type());
  TORCH_CHECK_VALUE(input_ids.size(0) >= 1 && input_ids.size(1) >= 1 &&
                        input_ids.size(1) <= config_.max_position_embeddings,
                    "[clip] input_ids must be (B, L) with B >= 1 and 1 <= L <= max_position_embeddings (",
                    config_.max_position_embeddings, "), got ", input_ids.sizes());
  const int64_t lo = input_ids.min().item<int64_t>(), hi = input_ids.max().item<int64_t>();
  TORCH_CHECK_VALUE(lo >= 0 && hi < config_.vocab_size, "[clip] input_ids must be in [0, ",
                    config_.vocab_size, "), got values in [", lo, ", ", hi, "]");
  return text_model->forward(input_ids);
}

namespace {

bool has_key_with_prefix(const std::vector<io::SafetensorsFile>& files, const std::string& prefix) {
  for (const auto& file : files) {
    for (const auto& name : file.names()) {
      if (name.rfind(prefix, 0) == 0) return true;
    }
  }
  return false;
}

}  // namespace

ClipTextModel load_clip_text_model(const std::vector<std::string>& files, const ClipTextConfig& config,
                                   at::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    throw_value_error(std::string("[clip] dtype must be float32 or bfloat16, got ") + c10::toString(dtype));
  }
  if (files.empty()) throw_value_error("[clip] load_clip_text_model needs at least one weights file");
  // Built in its dtype, as transformers' from_pretrained(dtype=...) builds it: built in float32
  // and then cast, a bf16 CLIP would hold its float32 weights too while loading.
  ClipTextModel model{nullptr};
  {
    DefaultDtypeGuard guard(dtype);
    model = ClipTextModel(config);
  }
  model->to(dtype);  // anything built outside the default dtype
  std::vector<io::SafetensorsFile> opened;
  std::string names;
  for (const auto& path : files) {
    opened.push_back(io::SafetensorsFile::open(path));
    names += (names.empty() ? "'" : ", '") + path + "'";
  }
  io::LoadOptions options;
  // Non-strict here only so that the problems come back as a report; any problem is thrown below
  // with the file names, and the partly loaded model is dropped.
  options.strict = false;
  // transformers 5 dropped CLIPTextModel's `text_model` submodule (models/clip/modeling_clip.py,
  // CLIPTextModel.__init__ holds embeddings / encoder / final_layer_norm itself), so a text encoder
  // saved by it has no "text_model." prefix; transformers reads both layouts, and so does remat.
  if (!has_key_with_prefix(opened, "text_model.") && has_key_with_prefix(opened, "embeddings.")) {
    options.add_prefix = "text_model.";
  }
  // transformers registers position_ids as a non-persistent buffer (arange); old versions saved it.
  options.key_filter = [](const std::string& key) {
    return key != "text_model.embeddings.position_ids" && key != "embeddings.position_ids";
  };
  const io::LoadReport report = io::load_state_dict_into(*model, opened, options);
  if (!report.ok()) {
    throw_value_error("[clip] " + names + " does not match CLIPTextModel (hidden_size " +
                      std::to_string(config.hidden_size) + ", " + std::to_string(config.num_hidden_layers) +
                      " layers, vocab_size " + std::to_string(config.vocab_size) + "):\n" + report.describe());
  }
  model->eval();
  return model;
}

ClipTextModel load_clip_text_model(const std::string& path, const ClipTextConfig& config, at::ScalarType dtype) {
  return load_clip_text_model(std::vector<std::string>{path}, config, dtype);
}

}  // namespace remat::encoders
