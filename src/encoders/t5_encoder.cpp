#include "remat/default_dtype.h"
#include "remat/encoders/t5_encoder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include <ATen/core/grad_mode.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/ScalarTypeToTypeMeta.h>
#include <c10/util/Exception.h>
#include <torch/nn/init.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "remat/compat.h"
#include "remat/encoders/activations.h"
#include "remat/util/error.h"

// Ported from transformers' models/t5/modeling_t5.py (T5LayerNorm, T5DenseActDense,
// T5DenseGatedActDense, T5LayerFF, T5Attention, T5Block, T5Stack, T5EncoderModel); docs/T5.md.

namespace remat::encoders {
namespace {

constexpr const char* kT5Tag = "[t5]";

// Note [T5 attention in query chunks]: the largest piece of the score matrix alive at once.
constexpr int64_t kT5ScoreChunkBytes = int64_t{16} << 20;

torch::nn::Linear linear_no_bias(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  throw_value_error(s.str());
}

// Holder for one `layer.N` entry of a block, so keys read layer.0.SelfAttention.q.weight.
std::shared_ptr<torch::nn::Module> sublayer(const char* name, std::shared_ptr<torch::nn::Module> inner,
                                           std::shared_ptr<torch::nn::Module> norm) {
  auto holder = std::make_shared<torch::nn::Module>();
  holder->register_module(name, std::move(inner));
  holder->register_module("layer_norm", std::move(norm));
  return holder;
}

}  // namespace

at::Tensor clamp_fp16_residual(const at::Tensor& h) {
  // Upstream (T5Block.forward) clamps only fp16: to finfo.max, or 1000 below it when something
  // already overflowed, so the next layer does not see inf. NaNs pass through.
  if (h.scalar_type() != at::kHalf) return h;
  const double max = 65504.0;
  const double c = at::isinf(h).any().item<bool>() ? max - 1000.0 : max;
  // LibTorch 1.13 has no fp16 clamp kernel on CPU; the detour through fp32 is exact.
  if (h.device().is_cpu()) return at::clamp(h.to(at::kFloat), -c, c).to(at::kHalf);
  return at::clamp(h, -c, c);
}

at::Tensor relative_position_bucket(const at::Tensor& relative_position, bool bidirectional,
                                    int64_t num_buckets, int64_t max_distance) {
  if (num_buckets < (bidirectional ? 4 : 2) || max_distance <= 0) {
    fail("[t5] relative_position_bucket needs num_buckets >= ", bidirectional ? 4 : 2,
         " and max_distance > 0, got ", num_buckets, " and ", max_distance);
  }
  const auto rel = relative_position.to(at::kLong);
  at::Tensor buckets = at::zeros_like(rel);
  at::Tensor n;
  if (bidirectional) {
    num_buckets /= 2;
    buckets = buckets + (rel > 0).to(at::kLong) * num_buckets;
    n = at::abs(rel);
  } else {
    n = -at::minimum(rel, at::zeros_like(rel));
  }
  const int64_t max_exact = num_buckets / 2;
  // The same float32 ops as upstream (log(n / max_exact) / log(max_distance / max_exact)), so the
  // bucket edges fall exactly where upstream's do; n = 0 gives -inf here but is "small".
  const at::Tensor large =
      max_exact + (at::log(n.to(at::kFloat) / static_cast<double>(max_exact)) /
                   std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                   static_cast<double>(num_buckets - max_exact))
                      .to(at::kLong);
  const at::Tensor capped = at::minimum(large, at::full_like(large, num_buckets - 1));
  return buckets + at::where(n < max_exact, n, capped);
}

T5LayerNormImpl::T5LayerNormImpl(int64_t hidden_size, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({hidden_size}));
}

at::Tensor T5LayerNormImpl::forward(const at::Tensor& x) {
  // Upstream takes the mean of squares in fp32 (`to(torch.float32)`), also for fp64 input; fp64
  // stays fp64 here so the float64 tests compare exact formulas (fp32/bf16/fp16 are unchanged).
  const auto stat_dtype = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor variance = x.to(stat_dtype).pow(2).mean(-1, /*keepdim=*/true);
  // x (own dtype) * fp32 rsqrt promotes to fp32: normalise in fp32, round once to the weight dtype.
  at::Tensor y = x * at::rsqrt(variance + eps_);
  if (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16) {
    y = y.to(weight.scalar_type());
  }
  return weight * y;
}

T5AttentionImpl::T5AttentionImpl(const T5Config& config, bool has_relative_attention_bias)
    : config_(config) {
  const int64_t D = config.d_model, inner = config.inner_dim();
  q = register_module("q", linear_no_bias(D, inner));
  k = register_module("k", linear_no_bias(D, inner));
  v = register_module("v", linear_no_bias(D, inner));
  o = register_module("o", linear_no_bias(inner, D));
  if (has_relative_attention_bias) {
    relative_attention_bias = register_module(
        "relative_attention_bias",
        torch::nn::Embedding(config.relative_attention_num_buckets, config.num_heads));
  }
}

at::Tensor T5AttentionImpl::compute_bias(int64_t query_length, int64_t key_length) {
  TORCH_CHECK(!relative_attention_bias.is_empty(),
              "[t5] compute_bias needs the relative_attention_bias table (block 0)");
  const auto device = relative_attention_bias->weight.device();
  const auto opts = torch::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor context = torch::arange(query_length, opts).unsqueeze(1);
  const at::Tensor memory = torch::arange(key_length, opts).unsqueeze(0);
  const at::Tensor buckets = relative_position_bucket(memory - context, /*bidirectional=*/true,
                                                      config_.relative_attention_num_buckets,
                                                      config_.relative_attention_max_distance);
  // (Lq, Lk, H) -> (1, H, Lq, Lk)
  return relative_attention_bias->forward(buckets).permute({2, 0, 1}).unsqueeze(0);
}

// Note [T5 attention in query chunks]
// Without a fused kernel (LibTorch 1.13) the scores are computed for a chunk of queries at a time.
// Softmax rows are independent: each row is the same product, bias, fp32 softmax and product with
// v as with the whole (H, L, L) matrix (the contracted dimension is untouched, so the sums run in
// the same order), while only (H, chunk, L) of it is alive. At FLUX.1's 512 tokens T5-XXL's 64
// heads make the whole matrix 64 MiB in fp32, and transformers' eager path holds it twice (scores
// and softmax). The fused kernel never materialises it at all.
at::Tensor T5AttentionImpl::forward(const at::Tensor& x, const at::Tensor& position_bias) {
  const int64_t B = x.size(0), L = x.size(1), H = config_.num_heads, dk = config_.d_kv;
  auto heads = [&](const at::Tensor& t) { return t.view({B, -1, H, dk}).transpose(1, 2); };
  at::Tensor out;
  if (fused_attention) {
    // transformers' sdpa_attention_forward (integrations/sdpa_attention.py, the default since 5.0)
    // for T5Attention: the position bias (with the padding mask in it) as SDPA's additive mask,
    // scale 1 (T5Attention.scaling). The scores stay in fp32 inside the kernel; in bf16 this is
    // several times more accurate and faster than the eager formula below (docs/PERFORMANCE.md).
    out = compat::scaled_dot_product_attention(heads(q->forward(x)), heads(k->forward(x)), heads(v->forward(x)),
                                               position_bias, /*scale=*/1.0);
  } else {
    out = attend_in_query_chunks(heads(q->forward(x)), heads(k->forward(x)).transpose(3, 2), heads(v->forward(x)),
                                 position_bias);
  }
  return o->forward(out.transpose(1, 2).reshape({B, L, H * dk}));
}

// transformers' eager T5 attention before 5.0 (models/t5/modeling_t5.py T5Attention.forward at
// 6b8b757dfcb582379a64f013cdce46c43629f2b0): scores += position_bias,
// softmax(scores.float()).type_as(scores), matmul with v; Note [T5 attention in query chunks].
at::Tensor T5AttentionImpl::attend_in_query_chunks(const at::Tensor& qh, const at::Tensor& kt, const at::Tensor& vh,
                                                   const at::Tensor& position_bias) const {
  const int64_t B = qh.size(0), H = qh.size(1), L = qh.size(2), Lk = kt.size(3);
  // Queries per chunk: (B, H, chunk, Lk) fp32 scores of at most kT5ScoreChunkBytes.
  const int64_t chunk = query_chunk > 0 ? query_chunk
                                        : std::max<int64_t>(1, kT5ScoreChunkBytes / std::max<int64_t>(1, B * H * Lk * 4));
  // Upstream's softmax runs in fp32 (`scores.float()`); fp64 stays fp64 (see T5LayerNormImpl).
  const auto softmax_dtype = qh.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor out = at::empty({B, H, L, vh.size(3)}, vh.options());
  for (int64_t s = 0; s < L; s += chunk) {
    const int64_t e = std::min(L, s + chunk);
    // No 1/sqrt(d_kv): Mesh-TensorFlow T5 folds it into the initialisation of q.
    at::Tensor scores = at::matmul(qh.slice(2, s, e), kt);
    // In place, as upstream: the sum is rounded to the scores' dtype. The bias broadcasts over
    // batch (and over queries when it has one row).
    scores += position_bias.size(2) == 1 ? position_bias : position_bias.slice(2, s, e);
    const at::Tensor weights = at::softmax(scores.to(softmax_dtype), -1).to(scores.scalar_type());
    scores.reset();
    out.slice(2, s, e).copy_(at::matmul(weights, vh));
  }
  return out;
}

T5DenseReluDenseImpl::T5DenseReluDenseImpl(const T5Config& config) : config_(config) {
  if (config.is_gated_act) {
    wi_0 = register_module("wi_0", linear_no_bias(config.d_model, config.d_ff));
    wi_1 = register_module("wi_1", linear_no_bias(config.d_model, config.d_ff));
  } else {
    wi = register_module("wi", linear_no_bias(config.d_model, config.d_ff));
  }
  wo = register_module("wo", linear_no_bias(config.d_ff, config.d_model));
}

at::Tensor T5DenseReluDenseImpl::forward(const at::Tensor& x) {
  auto act = [&](const at::Tensor& t) {
    if (config_.dense_act_fn == "gelu_new") return gelu_new(t);
    if (config_.dense_act_fn == "gelu") return at::gelu(t);
    return at::relu(t);
  };
  at::Tensor h;
  if (!config_.is_gated_act) {
    h = act(wi->forward(x));
  } else if (at::GradMode::is_enabled()) {
    h = act(wi_0->forward(x)) * wi_1->forward(x);
  } else {
    // Without autograd: the activation in wi_0's output (gelu_new_consuming) and the gate
    // multiplied into it, two (L, d_ff) buffers where upstream holds three; the same bits.
    h = config_.dense_act_fn == "gelu_new" ? gelu_new_consuming(wi_0->forward(x)) : act(wi_0->forward(x));
    h.mul_(wi_1->forward(x));
  }
  // wo may be kept in fp32 (fp16 models): upstream casts the activations to wo's dtype.
  if (h.scalar_type() != wo->weight.scalar_type()) h = h.to(wo->weight.scalar_type());
  return wo->forward(h);
}

T5BlockImpl::T5BlockImpl(const T5Config& config, bool has_relative_attention_bias) {
  self_attention = T5Attention(config, has_relative_attention_bias);
  attention_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon);
  dense_relu_dense = T5DenseReluDense(config);
  ff_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon);
  auto layer = register_module("layer", torch::nn::ModuleList());
  layer->push_back(sublayer("SelfAttention", self_attention.ptr(), attention_norm.ptr()));
  layer->push_back(sublayer("DenseReluDense", dense_relu_dense.ptr(), ff_norm.ptr()));
}

at::Tensor T5BlockImpl::forward(at::Tensor h_in, const at::Tensor& position_bias) {
  // The residual sums go into the sublayers' outputs (new tensors that nothing saves for
  // backward; h + a and a + h round alike), and h_in, when the caller handed over its only
  // reference (T5EncoderModelImpl::forward moves it in), is freed once the first sum holds it.
  at::Tensor h = self_attention->forward(attention_norm->forward(h_in), position_bias);
  h.add_(h_in);
  h_in.reset();
  h = clamp_fp16_residual(h);
  at::Tensor ff = dense_relu_dense->forward(ff_norm->forward(h));
  ff.add_(h);
  h.reset();
  return clamp_fp16_residual(ff);
}

T5StackImpl::T5StackImpl(const T5Config& config) {
  block = register_module("block", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_layers; ++i) block->push_back(T5Block(config, i == 0));
  final_layer_norm =
      register_module("final_layer_norm", T5LayerNorm(config.d_model, config.layer_norm_epsilon));
}

T5EncoderModelImpl::T5EncoderModelImpl(T5Config config) : config_(std::move(config)) {
  config_.validate();
  shared = register_module("shared", torch::nn::Embedding(config_.vocab_size, config_.d_model));
  encoder = register_module("encoder", T5Stack(config_));
}

at::Tensor T5EncoderModelImpl::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask) {
  if (input_ids.dim() != 2) fail("[t5] input_ids must be (B, L), got shape ", input_ids.sizes());
  if (at::isFloatingType(input_ids.scalar_type())) {
    fail("[t5] input_ids must be integers, got ", input_ids.scalar_type());
  }
  const int64_t L = input_ids.size(1);
  if (input_ids.numel() > 0) {
    const int64_t lo = input_ids.min().item<int64_t>(), hi = input_ids.max().item<int64_t>();
    if (lo < 0 || hi >= config_.vocab_size) {
      fail("[t5] input_ids must be in [0, ", config_.vocab_size, "), got values in [", lo, ", ", hi, "]");
    }
  }
  if (attention_mask.defined()) {
    if (attention_mask.sizes() != input_ids.sizes()) {
      fail("[t5] attention_mask must have the shape of input_ids ", input_ids.sizes(), ", got ",
           attention_mask.sizes());
    }
  }
  at::Tensor h = shared->forward(input_ids.to(at::kLong));  // no sqrt(D) scaling in T5
  auto* block0 = encoder->block->ptr<T5BlockImpl>(0).get();
  at::Tensor position_bias = block0->self_attention->compute_bias(L, L);
  if (attention_mask.defined()) {
    // Upstream's extended mask: (1 - m) * finfo(dtype).min in the model's dtype, added to block
    // 0's bias; every later block reuses the sum.
    const auto dtype = shared->weight.scalar_type();
    const double lowest = dtype == at::kDouble  ? std::numeric_limits<double>::lowest()
                          : dtype == at::kHalf  ? -65504.0
                          : dtype == at::kBFloat16 ? -3.3895313892515355e38
                                                   : static_cast<double>(std::numeric_limits<float>::lowest());
    const at::Tensor m = attention_mask.to(dtype).unsqueeze(1).unsqueeze(2);
    position_bias = position_bias + (1.0 - m) * lowest;
  }
  for (const auto& block : *encoder->block) {
    h = block->as<T5BlockImpl>()->forward(std::move(h), position_bias);
  }
  return encoder->final_layer_norm->forward(h);
}

namespace {

std::string file_list(const std::vector<io::SafetensorsFile>& files) {
  std::string out;
  for (const auto& f : files) out += (out.empty() ? "'" : ", '") + f.path() + "'";
  return out.empty() ? "(no files)" : out;
}

bool is_ignored_key(const std::string& key) {
  // A full T5 checkpoint (T5ForConditionalGeneration) also holds the decoder and the LM head;
  // T5EncoderModel ignores them on load (_keys_to_ignore_on_load_unexpected = [r"decoder"]).
  return key.rfind("decoder.", 0) == 0 || key.rfind("lm_head.", 0) == 0;
}

}  // namespace

T5EncoderModel load_t5_encoder(const std::vector<io::SafetensorsFile>& files, const T5Config& config,
                               at::ScalarType dtype) {
  config.validate();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf && dtype != at::kDouble) {
    fail("[t5] dtype must be float32, bfloat16, float16 or float64, got ", dtype);
  }
  if (files.empty()) throw_value_error("[t5] load_t5_encoder needs at least one safetensors file");
  constexpr const char* kShared = "shared.weight";
  constexpr const char* kEmbedTokens = "encoder.embed_tokens.weight";
  bool has_shared = false, has_embed_tokens = false;
  for (const auto& f : files) {
    has_shared = has_shared || f.contains(kShared);
    has_embed_tokens = has_embed_tokens || f.contains(kEmbedTokens);
  }
  T5EncoderModel model{nullptr};
  {
    DefaultDtypeGuard guard(dtype);
    model = T5EncoderModel(config);
  }
  if (dtype == at::kHalf) {
    // transformers' _keep_in_fp32_modules = ["wo"] applies when loading in fp16 (T5 v1.1's FF
    // output overflows fp16); not in bf16, which has fp32's range.
    for (const auto& block : *model->encoder->block) {
      block->as<T5BlockImpl>()->dense_relu_dense->wo->to(at::kFloat);
    }
  }
  // Upstream's embed_tokens *is* `shared` (one tensor). When a file stores it only under the
  // encoder's name, load through a second root that names the same modules that way.
  const bool via_embed_tokens = !has_shared && has_embed_tokens;
  io::LoadOptions options;
  options.key_filter = [via_embed_tokens](const std::string& key) {
    if (is_ignored_key(key)) return false;
    return via_embed_tokens ? key != kShared : key != kEmbedTokens;
  };
  torch::nn::Module alias_root;
  torch::nn::Module* target = model.get();
  if (via_embed_tokens) {
    auto stack = std::make_shared<torch::nn::Module>();
    stack->register_module("block", model->encoder->block.ptr());
    stack->register_module("final_layer_norm", model->encoder->final_layer_norm.ptr());
    stack->register_module("embed_tokens", model->shared.ptr());
    alias_root.register_module("encoder", stack);
    target = &alias_root;
  }
  try {
    io::load_state_dict_into(*target, files, options);
  } catch (const c10::Error& e) {
    std::string why = e.what_without_backtrace();
    while (!why.empty() && why.back() == '\n') why.pop_back();
    throw_value_error(std::string(kT5Tag) + " cannot load the T5 encoder from " +
                      file_list(files) + ": " + why);
  }
  model->eval();
  return model;
}

}  // namespace remat::encoders
