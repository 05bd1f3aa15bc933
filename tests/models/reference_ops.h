#pragma once
// Reference math for the models tests, written from the formulas of the upstream code (diffusers'
// transformer_flux.py, embeddings.py, normalization.py; SimpleTuner's vendored MageFlow
// mage_layers.py) in plain tensor ops (float64), calling nothing from the implementation.

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "remat/models/blocks.h"

namespace remat::models::test::reference {

using torch::indexing::None;
using torch::indexing::Slice;

inline at::Tensor ref_linear(const std::map<std::string, at::Tensor>& p, const std::string& name,
                      const at::Tensor& x) {
  return x.matmul(p.at(name + ".weight").t()) + p.at(name + ".bias");
}

inline at::Tensor ref_ln(const at::Tensor& x) {
  const auto mean = x.mean(-1, true);
  const auto var = (x - mean).pow(2).mean(-1, true);
  return (x - mean) / (var + 1e-6).sqrt();
}

inline at::Tensor ref_rms(const at::Tensor& x, const at::Tensor& w) {
  return x / (x.pow(2).mean(-1, true) + 1e-6).sqrt() * w;
}

inline at::Tensor ref_silu(const at::Tensor& x) { return x / (1 + (-x).exp()); }

inline at::Tensor ref_gelu(const at::Tensor& x) {
  return 0.5 * x * (1 + (std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))).tanh());
}

// Angles (N, d/2) of the Flux RoPE from ids (N, 3), float64 loops over the formula.
inline at::Tensor ref_rope_angles(const at::Tensor& ids, const std::vector<int64_t>& axes) {
  const int64_t n = ids.size(0);
  int64_t half = 0;
  for (auto a : axes) half += a / 2;
  auto angles = torch::zeros({n, half}, torch::kFloat64);
  auto acc = angles.accessor<double, 2>();
  auto id = ids.to(torch::kFloat64).contiguous();
  auto ida = id.accessor<double, 2>();
  for (int64_t r = 0; r < n; ++r) {
    int64_t lane = 0;
    for (size_t a = 0; a < axes.size(); ++a) {
      for (int64_t j = 0; j < axes[a] / 2; ++j) {
        acc[r][lane++] = ida[r][a] * (1.0 / std::pow(10000.0, 2.0 * j / axes[a]));
      }
    }
  }
  return angles;
}

// The tables the module receives: each angle's cos/sin rounded to float32, repeated per pair.
inline RotaryTables tables_from_angles(const at::Tensor& angles) {
  return {angles.cos().to(torch::kFloat32).repeat_interleave(2, 1),
          angles.sin().to(torch::kFloat32).repeat_interleave(2, 1)};
}

// Rotation of adjacent pairs, x (B, N, H, d), angles (N, d/2); cos/sin rounded to float32 as the
// tables are.
inline at::Tensor ref_rope(const at::Tensor& x, const at::Tensor& angles) {
  const auto c = angles.cos().to(torch::kFloat32).to(torch::kFloat64).unsqueeze(1);
  const auto s = angles.sin().to(torch::kFloat32).to(torch::kFloat64).unsqueeze(1);
  const auto x0 = x.index({"...", Slice(0, None, 2)});
  const auto x1 = x.index({"...", Slice(1, None, 2)});
  return torch::stack({x0 * c - x1 * s, x1 * c + x0 * s}, -1).flatten(-2);
}

// softmax(q k^T / sqrt(d)) v per head; (B, N, H, d) -> (B, N, H*d).
inline at::Tensor ref_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const auto qh = q.transpose(1, 2), kh = k.transpose(1, 2), vh = v.transpose(1, 2);
  auto scores = qh.matmul(kh.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(-1)));
  scores = (scores - std::get<0>(scores.max(-1, true))).exp();
  const auto weights = scores / scores.sum(-1, true);
  return weights.matmul(vh).transpose(1, 2).flatten(-2);
}

// v cast to `dtype` and back: float32 and bfloat16 (round-to-nearest-even on the upper 16 bits of
// the float32) are rounded, float64 is unchanged.
inline double ref_round(double v, at::ScalarType dtype) {
  if (dtype == torch::kFloat64) return v;
  float f = static_cast<float>(v);
  if (dtype == torch::kBFloat16) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
    std::memcpy(&f, &bits, 4);
  }
  return f;
}

// MageFlow's timestep sinusoid (n, 256) for a model whose activations are `dtype`, as the vendored
// code computes it (checked against it once, for float32 and bfloat16 models): sigma and the
// float32 frequency table exp(-ln(10000) k / 128) cast to that dtype, sigma taken as float32 for
// the product, arg = 1000 * sigma * freq, [cos | sin].
inline at::Tensor ref_mageflow_sinusoid(const std::vector<double>& sigmas, at::ScalarType dtype) {
  auto out = torch::empty({static_cast<int64_t>(sigmas.size()), 256}, torch::kFloat64);
  auto a = out.accessor<double, 2>();
  for (size_t b = 0; b < sigmas.size(); ++b) {
    const double t = static_cast<float>(ref_round(sigmas[b], dtype));
    for (int64_t k = 0; k < 128; ++k) {
      const double freq = ref_round(static_cast<float>(std::exp(-std::log(10000.0) * k / 128.0)), dtype);
      const double arg = 1000.0 * t * freq;
      a[b][k] = std::cos(arg);
      a[b][128 + k] = std::sin(arg);
    }
  }
  return out;
}

inline std::map<std::string, at::Tensor> params_of(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : m.named_parameters()) out[item.key()] = item.value().detach();
  return out;
}

// Random weights everywhere (zero-initialised or ones-initialised parameters would hide errors).
inline void randomise(torch::nn::Module& m, double scale = 0.2) {
  torch::NoGradGuard guard;
  for (auto& p : m.parameters()) p.copy_(torch::randn_like(p) * scale);
}

}  // namespace remat::models::test::reference
