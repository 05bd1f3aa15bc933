#pragma once
// Float64 references for the VAE tests, written from the formulas of diffusers' code (resnet.py
// ResnetBlock2D, downsampling.py Downsample2D, upsampling.py Upsample2D, the mid-block Attention,
// autoencoders/vae.py Encoder and Decoder) with elementary tensor ops only: no at::conv2d,
// group_norm, softmax, silu or interpolate, so a mistake in the library's use of those kernels
// cannot hide in the reference too.
// Weights are looked up by diffusers' key names in a flat parameter map.

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace remat::testing::vae {

using Params = std::map<std::string, at::Tensor>;

// `prefix` names a lone block (whose own keys have none), e.g. "block" -> "block.conv1.weight".
inline Params params_of(const torch::nn::Module& m, const std::string& prefix = "") {
  Params p;
  for (const auto& item : m.named_parameters()) {
    p[prefix.empty() ? item.key() : prefix + "." + item.key()] = item.value().detach().to(at::kDouble);
  }
  return p;
}

inline at::Tensor silu_ref(const at::Tensor& x) { return x / (1.0 + at::exp(-x)); }

// GroupNorm: per (image, group) mean and biased variance over (C/G, H, W), then the affine.
inline at::Tensor group_norm_ref(const at::Tensor& x, int64_t groups, const at::Tensor& w, const at::Tensor& b,
                             double eps = 1e-6) {
  const int64_t B = x.size(0), C = x.size(1);
  const at::Tensor g = x.reshape({B, groups, -1});
  const at::Tensor mean = g.sum(-1, true) / static_cast<double>(g.size(-1));
  const at::Tensor centred = g - mean;
  const at::Tensor var = (centred * centred).sum(-1, true) / static_cast<double>(g.size(-1));
  const at::Tensor normed = (centred / at::sqrt(var + eps)).reshape(x.sizes());
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = C;
  return normed * w.reshape(shape) + b.reshape(shape);
}

// Cross-correlation as a sum over kernel offsets: out[o, y, x] = b[o] + sum_{i, ky, kx}
// W[o, i, ky, kx] * xpad[i, s*y + ky, s*x + kx], with explicit zero padding (left, right, top, bottom).
inline at::Tensor conv2d_ref(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, int64_t stride,
                         int64_t pad_left, int64_t pad_right, int64_t pad_top, int64_t pad_bottom) {
  const int64_t B = x.size(0), Cin = x.size(1), H = x.size(2), W = x.size(3);
  at::Tensor xp = at::zeros({B, Cin, H + pad_top + pad_bottom, W + pad_left + pad_right}, x.options());
  xp.slice(2, pad_top, pad_top + H).slice(3, pad_left, pad_left + W).copy_(x);
  const int64_t k = w.size(2);
  const int64_t Ho = (xp.size(2) - k) / stride + 1, Wo = (xp.size(3) - k) / stride + 1;
  at::Tensor out = at::zeros({B, w.size(0), Ho, Wo}, x.options());
  for (int64_t ky = 0; ky < k; ++ky) {
    for (int64_t kx = 0; kx < k; ++kx) {
      const at::Tensor patch = xp.slice(2, ky, ky + stride * (Ho - 1) + 1, stride)
                                   .slice(3, kx, kx + stride * (Wo - 1) + 1, stride);  // (B, Cin, Ho, Wo)
      const at::Tensor wk = w.select(3, kx).select(2, ky);                             // (Cout, Cin)
      out += at::einsum("oi,bihw->bohw", {wk, patch});
    }
  }
  return out + b.reshape({1, -1, 1, 1});
}

inline at::Tensor conv(const Params& p, const std::string& name, const at::Tensor& x, int64_t pad = -1) {
  const at::Tensor& w = p.at(name + ".weight");
  const int64_t pd = pad >= 0 ? pad : w.size(2) / 2;
  return conv2d_ref(x, w, p.at(name + ".bias"), 1, pd, pd, pd, pd);
}

inline at::Tensor resnet(const Params& p, const std::string& n, const at::Tensor& x, int64_t G) {
  at::Tensor h = conv(p, n + ".conv1", silu_ref(group_norm_ref(x, G, p.at(n + ".norm1.weight"), p.at(n + ".norm1.bias"))));
  h = conv(p, n + ".conv2", silu_ref(group_norm_ref(h, G, p.at(n + ".norm2.weight"), p.at(n + ".norm2.bias"))));
  const at::Tensor s = p.count(n + ".conv_shortcut.weight") ? conv(p, n + ".conv_shortcut", x) : x;
  return s + h;
}

// Pad one column right and one row at the bottom, 3x3 stride 2, no further padding.
inline at::Tensor downsample(const Params& p, const std::string& n, const at::Tensor& x) {
  return conv2d_ref(x, p.at(n + ".conv.weight"), p.at(n + ".conv.bias"), 2, 0, 1, 0, 1);
}

// out[y, x] = in[y / 2, x / 2], then a 3x3 conv with padding 1.
inline at::Tensor upsample(const Params& p, const std::string& n, const at::Tensor& x) {
  const at::Tensor up = x.repeat_interleave(2, 2).repeat_interleave(2, 3);
  return conv(p, n + ".conv", up);
}

inline at::Tensor linear_ref(const Params& p, const std::string& n, const at::Tensor& x) {
  return at::matmul(x, p.at(n + ".weight").t()) + p.at(n + ".bias");
}

// One head over the H*W positions: softmax(q k^T / sqrt(C)) v, softmax as exp / sum.
inline at::Tensor attention(const Params& p, const std::string& n, const at::Tensor& x, int64_t G) {
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const at::Tensor t = group_norm_ref(x, G, p.at(n + ".group_norm.weight"), p.at(n + ".group_norm.bias"))
                           .reshape({B, C, H * W})
                           .transpose(1, 2);
  const at::Tensor q = linear_ref(p, n + ".to_q", t), k = linear_ref(p, n + ".to_k", t), v = linear_ref(p, n + ".to_v", t);
  at::Tensor s = at::matmul(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(C));
  s = at::exp(s - std::get<0>(s.max(-1, true)));
  const at::Tensor probs = s / s.sum(-1, true);
  const at::Tensor o = linear_ref(p, n + ".to_out.0", at::matmul(probs, v));
  return o.transpose(1, 2).reshape({B, C, H, W}) + x;
}

inline at::Tensor mid_block(const Params& p, const std::string& n, const at::Tensor& x, int64_t G, bool attn) {
  at::Tensor h = resnet(p, n + ".resnets.0", x, G);
  if (attn) h = attention(p, n + ".attentions.0", h, G);
  return resnet(p, n + ".resnets.1", h, G);
}

struct Shape {
  std::vector<int64_t> blocks;
  int64_t layers, groups;
  bool attention, quant_conv, post_quant_conv;
};

inline at::Tensor encoder(const Params& p, const Shape& s, const at::Tensor& x) {
  at::Tensor h = conv(p, "encoder.conv_in", x);
  const int64_t n = static_cast<int64_t>(s.blocks.size());
  for (int64_t i = 0; i < n; ++i) {
    const std::string b = "encoder.down_blocks." + std::to_string(i);
    for (int64_t r = 0; r < s.layers; ++r) h = resnet(p, b + ".resnets." + std::to_string(r), h, s.groups);
    if (i < n - 1) h = downsample(p, b + ".downsamplers.0", h);
  }
  h = mid_block(p, "encoder.mid_block", h, s.groups, s.attention);
  h = silu_ref(group_norm_ref(h, s.groups, p.at("encoder.conv_norm_out.weight"), p.at("encoder.conv_norm_out.bias")));
  h = conv(p, "encoder.conv_out", h);
  return s.quant_conv ? conv(p, "quant_conv", h) : h;
}

inline at::Tensor decoder(const Params& p, const Shape& s, const at::Tensor& z) {
  at::Tensor h = s.post_quant_conv ? conv(p, "post_quant_conv", z) : z;
  h = conv(p, "decoder.conv_in", h);
  h = mid_block(p, "decoder.mid_block", h, s.groups, s.attention);
  const int64_t n = static_cast<int64_t>(s.blocks.size());
  for (int64_t i = 0; i < n; ++i) {
    const std::string b = "decoder.up_blocks." + std::to_string(i);
    for (int64_t r = 0; r <= s.layers; ++r) h = resnet(p, b + ".resnets." + std::to_string(r), h, s.groups);
    if (i < n - 1) h = upsample(p, b + ".upsamplers.0", h);
  }
  h = silu_ref(group_norm_ref(h, s.groups, p.at("decoder.conv_norm_out.weight"), p.at("decoder.conv_norm_out.bias")));
  return conv(p, "decoder.conv_out", h);
}

}  // namespace remat::testing::vae
