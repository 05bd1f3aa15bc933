#include "remat/models/blocks.h"

#include <numeric>

#include <torch/nn/modules/dropout.h>
#include <torch/torch.h>

#include "remat/compat.h"
#include "remat/models/checkpointing.h"

namespace remat::models {

RotaryTables flux_rope_tables(const at::Tensor& ids, const std::vector<int64_t>& axes_dims,
                              double theta) {
  TORCH_CHECK_VALUE(ids.dim() == 2 && ids.size(1) == static_cast<int64_t>(axes_dims.size()),
                    "[FluxPosEmbed] ids must be (N, ", axes_dims.size(), "), got shape ", ids.sizes());
  // diffusers get_1d_rotary_pos_embed with use_real + repeat_interleave_real: float64 tables
  // (except on MPS/NPU), cast to float32 at the end.
  const at::Tensor pos = ids.to(at::kFloat).to(at::kDouble);
  std::vector<at::Tensor> cos_parts, sin_parts;
  for (size_t a = 0; a < axes_dims.size(); ++a) {
    const int64_t dim = axes_dims[a];
    TORCH_CHECK_VALUE(dim >= 2 && dim % 2 == 0, "[FluxPosEmbed] axes_dims[", a,
                      "] must be even and >= 2, got ", dim);
    const auto opts = pos.options().dtype(at::kDouble);
    at::Tensor inv = 1.0 / at::pow(theta, at::arange(0, dim, 2, opts) / static_cast<double>(dim));
    at::Tensor angle = at::outer(pos.select(1, static_cast<int64_t>(a)), inv);
    cos_parts.push_back(at::cos(angle).repeat_interleave(2, 1));
    sin_parts.push_back(at::sin(angle).repeat_interleave(2, 1));
  }
  return {at::cat(cos_parts, 1).to(at::kFloat), at::cat(sin_parts, 1).to(at::kFloat)};
}

at::Tensor apply_rope(const at::Tensor& x, const RotaryTables& rope) {
  TORCH_CHECK_VALUE(x.dim() == 4, "[RoPE] x must be (B, N, H, d), got shape ", x.sizes());
  TORCH_CHECK_VALUE(rope.cos.dim() == 2 && rope.cos.size(0) == x.size(1) &&
                        rope.cos.size(1) == x.size(3),
                    "[RoPE] tables must be (N, d) = (", x.size(1), ", ", x.size(3), "), got shape ",
                    rope.cos.sizes());
  const auto compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor xf = x.to(compute);
  // rot(x)[2j] = -x[2j+1], rot(x)[2j+1] = x[2j] (diffusers apply_rotary_emb, use_real_unbind_dim=-1).
  const auto pairs = xf.unflatten(-1, {x.size(3) / 2, 2});
  const at::Tensor rotated = at::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
  const at::Tensor cos = rope.cos.to(compute).unsqueeze(1);  // (N, 1, d)
  const at::Tensor sin = rope.sin.to(compute).unsqueeze(1);
  return (xf * cos + rotated * sin).to(x.scalar_type());
}

at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  return x.unflatten(-1, {heads, x.size(-1) / heads});
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  // (B, N, H, d) -> (B, H, N, d) for SDPA and back.
  at::Tensor out = compat::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                        v.transpose(1, 2));
  return out.transpose(1, 2).flatten(-2).to(q.scalar_type());
}

AttentionImpl::AttentionImpl(int64_t dim, int64_t heads, bool context, bool output) : heads_(heads) {
  TORCH_CHECK_VALUE(heads >= 1 && dim % heads == 0, "[Attention] heads must divide dim ", dim,
                    ", got ", heads);
  const int64_t head_dim = dim / heads;
  to_q = register_module("to_q", Linear(dim, dim));
  to_k = register_module("to_k", Linear(dim, dim));
  to_v = register_module("to_v", Linear(dim, dim));
  norm_q = register_module("norm_q", RMSNorm(head_dim));
  norm_k = register_module("norm_k", RMSNorm(head_dim));
  if (context) {
    add_q_proj = register_module("add_q_proj", Linear(dim, dim));
    add_k_proj = register_module("add_k_proj", Linear(dim, dim));
    add_v_proj = register_module("add_v_proj", Linear(dim, dim));
    norm_added_q = register_module("norm_added_q", RMSNorm(head_dim));
    norm_added_k = register_module("norm_added_k", RMSNorm(head_dim));
  }
  if (output) {
    to_out_0 = Linear(dim, dim);
    to_out = register_module("to_out", torch::nn::ModuleList(to_out_0, torch::nn::Dropout(0.0)));
  }
  if (context) to_add_out = register_module("to_add_out", Linear(dim, dim));
}

QKV AttentionImpl::project(const at::Tensor& x) {
  return {norm_q->forward(split_heads(to_q->forward(x), heads_)),
          norm_k->forward(split_heads(to_k->forward(x), heads_)),
          split_heads(to_v->forward(x), heads_)};
}

QKV AttentionImpl::project_context(const at::Tensor& c) {
  TORCH_CHECK(!add_q_proj.is_empty(), "[Attention] this attention has no context projections");
  return {norm_added_q->forward(split_heads(add_q_proj->forward(c), heads_)),
          norm_added_k->forward(split_heads(add_k_proj->forward(c), heads_)),
          split_heads(add_v_proj->forward(c), heads_)};
}

FluxTransformerBlockImpl::FluxTransformerBlockImpl(int64_t dim, int64_t heads) {
  norm1 = register_module("norm1", AdaLayerNormZero(dim));
  norm1_context = register_module("norm1_context", AdaLayerNormZero(dim));
  attn = register_module("attn", Attention(dim, heads, /*context=*/true, /*output=*/true));
  ff = register_module("ff", FeedForward(dim));
  ff_context = register_module("ff_context", FeedForward(dim));
}

std::pair<at::Tensor, at::Tensor> FluxTransformerBlockImpl::forward(
    const at::Tensor& x_in, const at::Tensor& c_in, const at::Tensor& temb,
    const RotaryTables& rope, std::optional<Backend> checkpoint_ffn,
    const std::optional<SavedTensorOffload>& offload_attention) {
  // Chunks: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, each (B, 1, D).
  Modulation m = norm1->forward(temb);
  Modulation mc = norm1_context->forward(temb);
  for (auto& t : m) t = t.unsqueeze(1);
  for (auto& t : mc) t = t.unsqueeze(1);

  // The attention half. Its projections, the joint q/k/v and the attention output are local to
  // this scope, as they are to diffusers' FluxAttnProcessor2_0.__call__ (attention_processor.py),
  // so without autograd they are freed before the feed-forward runs; with autograd the graph keeps
  // what backward needs either way.
  at::Tensor x_attn, c_attn;
  {
    const int64_t n_txt = c_in.size(1);
    at::Tensor x_mod = modulate(x_in, m[0], m[1]);
    at::Tensor c_mod = modulate(c_in, mc[0], mc[1]);
    // SimpleTuner's scope: self.attn(norm_hidden_states, norm_encoder_hidden_states, ...), whose
    // output projections diffusers' FluxAttnProcessor2_0 applies inside the call.
    const OffloadSavedTensors offload(offload_attention);
    at::Tensor q, k, v;
    {
      const QKV img = attn->project(x_mod);
      const QKV txt = attn->project_context(c_mod);
      x_mod.reset();  // without autograd nothing else holds them
      c_mod.reset();
      // Joint sequence [text; image], rotated after the q/k norms.
      q = apply_rope(at::cat({txt.q, img.q}, 1), rope);
      k = apply_rope(at::cat({txt.k, img.k}, 1), rope);
      v = at::cat({txt.v, img.v}, 1);
    }
    at::Tensor o = attention(q, k, v);
    q.reset();
    k.reset();
    v.reset();
    const at::Tensor a_c = attn->to_add_out->forward(o.narrow(1, 0, n_txt));
    const at::Tensor a = attn->to_out_0->forward(o.narrow(1, n_txt, o.size(1) - n_txt));
    o.reset();
    {
      // The gated residual is outside SimpleTuner's scope.
      const OffloadSavedTensors outside(std::nullopt);
      x_attn = x_in + m[2] * a;
      c_attn = c_in + mc[2] * a_c;
    }
  }

  // Feed-forward part of both streams (SimpleTuner's _ffn_forward of the double block).
  auto ffn = [this, m, mc](const Tensors& in) -> Tensors {
    const at::Tensor& x = in[0];
    const at::Tensor& c = in[1];
    at::Tensor x_out = x + m[5] * ff->forward(modulate(x, m[3], m[4]));
    at::Tensor c_out = c + mc[5] * ff_context->forward(modulate(c, mc[3], mc[4]));
    return {x_out, clip_fp16(c_out)};
  };
  const Tensors out = run_block_part(ffn, {x_attn, c_attn}, checkpoint_ffn);
  return {out[1], out[0]};
}

FluxSingleTransformerBlockImpl::FluxSingleTransformerBlockImpl(int64_t dim, int64_t heads,
                                                               int64_t mlp_ratio) {
  norm = register_module("norm", AdaLayerNormZeroSingle(dim));
  attn = register_module("attn", Attention(dim, heads, /*context=*/false, /*output=*/false));
  proj_mlp = register_module("proj_mlp", Linear(dim, mlp_ratio * dim));
  proj_out = register_module("proj_out", Linear(dim + mlp_ratio * dim, dim));
}

at::Tensor FluxSingleTransformerBlockImpl::forward(const at::Tensor& s, const at::Tensor& temb,
                                                   const RotaryTables& rope,
                                                   std::optional<Backend> checkpoint_ffn,
                                                   const std::optional<SavedTensorOffload>& offload_attention) {
  Modulation m = norm->forward(temb);  // shift, scale, gate
  const at::Tensor gate = m[2].unsqueeze(1);
  const at::Tensor s_mod = modulate(s, m[0].unsqueeze(1), m[1].unsqueeze(1));
  at::Tensor attn_out;
  {  // q, k, v freed once attended (diffusers: locals of FluxAttnProcessor2_0.__call__)
    const OffloadSavedTensors offload(offload_attention);  // SimpleTuner's scope: self.attn(...)
    const QKV qkv = attn->project(s_mod);
    attn_out = attention(apply_rope(qkv.q, rope), apply_rope(qkv.k, rope), qkv.v);
  }

  // SimpleTuner's single-block _ffn_forward(residual, norm_hidden_states, attn_output, gate).
  auto ffn = [this, gate](const Tensors& in) -> Tensors {
    const at::Tensor mlp = gelu_tanh(proj_mlp->forward(in[1]));
    const at::Tensor y = proj_out->forward(at::cat({in[2], mlp}, -1));
    return {clip_fp16(in[0] + gate * y)};
  };
  return run_block_part(ffn, {s, s_mod, attn_out}, checkpoint_ffn)[0];
}

}  // namespace remat::models
