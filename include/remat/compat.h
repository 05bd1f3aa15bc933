#pragma once
// Note [LibTorch versions]
// remat builds against Debian's LibTorch 1.13 (CPU) and against the LibTorch of a PyTorch 2.x
// install (CUDA). Every difference between the two that the project depends on lives here, so the
// rest of the code is written once.

#include <ATen/autocast_mode.h>
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#define REMAT_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||                \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

/// Whether the float8 dtypes (at::kFloat8_e4m3fn, ...) exist: LibTorch 2.1 and later.
#define REMAT_HAS_FLOAT8 REMAT_TORCH_VERSION_AT_LEAST(2, 1)

/// Whether at::scaled_dot_product_attention exists with its scale argument: LibTorch 2.1 and later.
#define REMAT_HAS_SCALED_DOT_PRODUCT_ATTENTION REMAT_TORCH_VERSION_AT_LEAST(2, 1)

namespace remat::compat {

inline constexpr bool kHasFloat8 = REMAT_HAS_FLOAT8;

/// Whether at::scaled_dot_product_attention exists with the scale argument the encoders need
/// (LibTorch 2.1 and later; 2.0 had the op without it).
inline constexpr bool kHasScaledDotProductAttention = REMAT_HAS_SCALED_DOT_PRODUCT_ATTENTION;

/// The backtrace argument of c10::Error's (message, backtrace) constructor, for errors about the
/// user's input, which carry none: 1.13 takes the backtrace as text (empty here); later releases
/// take a lazily computed one (c10/util/Exception.h, Error::Error(std::string, Backtrace)), null
/// here. Chosen by the constructor present.
using NoBacktrace = std::conditional_t<std::is_constructible_v<c10::Error, std::string, std::string>,
                                       std::string, std::nullptr_t>;
inline NoBacktrace no_backtrace() { return NoBacktrace{}; }

/// Autocast state of the calling thread for one device type. LibTorch 2.4 replaced the per-device
/// functions (is_enabled / is_cpu_enabled, get_autocast_gpu_dtype ...) with ones taking a
/// DeviceType; 1.13 only has the per-device ones.
inline bool autocast_enabled(c10::DeviceType type) {
#if REMAT_TORCH_VERSION_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(type);
#else
  return type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType type, bool enabled) {
#if REMAT_TORCH_VERSION_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(type, enabled);
#else
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

inline at::ScalarType autocast_dtype(c10::DeviceType type) {
#if REMAT_TORCH_VERSION_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(type);
#else
  return type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                      : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType type, at::ScalarType dtype) {
#if REMAT_TORCH_VERSION_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

/// Softmax attention over (B, H, L, d) tensors with an optional mask broadcastable to (B, H, L, S),
/// as at::scaled_dot_product_attention takes it: boolean (true = attend) or added to the scores
/// (a float tensor: a bias, finfo.min where masked). The scale defaults to 1/sqrt(d). Written out:
/// the scores, their scaling and the mask in the input dtype (rounded to bfloat16 for bfloat16
/// inputs, where the fused kernels accumulate in float32), the softmax in float32, the weights and
/// the product with v in the input dtype again. It materialises the (B, H, L, S) scores, their
/// softmax, and in training saves them for backward. What 1.13 runs; kept on every build as the
/// reference the fused kernel is tested against.
inline at::Tensor attention_formula(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const c10::optional<at::Tensor>& mask = c10::nullopt,
                                    c10::optional<double> scale = c10::nullopt) {
  const double s = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = at::matmul(q, k.transpose(-2, -1));
  if (s != 1.0) scores = scores * s;
  if (mask.has_value() && mask->defined()) {
    scores = mask->scalar_type() == at::kBool
                 ? scores.masked_fill(mask->logical_not(), -std::numeric_limits<float>::infinity())
                 : scores + *mask;
  }
  // float32 softmax for half types; float64 inputs keep float64 (as the fused op does).
  const auto softmax_dtype = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto weights = at::softmax(scores, -1, softmax_dtype).to(q.scalar_type());
  return at::matmul(weights, v);
}

/// The same attention through at::scaled_dot_product_attention where LibTorch has it (2.1+): a
/// fused kernel (flash / memory-efficient attention on CUDA, flash attention on the CPU) that never
/// holds the whole score matrix, keeps the scores in float32 (they are never rounded to a bfloat16
/// input's dtype) and saves only a log-sum-exp per row for backward. A mask that requires grad
/// (a trained bias) makes PyTorch choose its math kernel instead. 1.13: the formula.
inline at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v,
                                               const c10::optional<at::Tensor>& mask = c10::nullopt,
                                               c10::optional<double> scale = c10::nullopt) {
#if REMAT_HAS_SCALED_DOT_PRODUCT_ATTENTION
  return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false, scale);
#else
  return attention_formula(q, k, v, mask, scale);
#endif
}

/// The key under which LibTorch's C++ optimizers keep a parameter's state in `state()`: the
/// TensorImpl address formatted as a string in 1.13, the raw address in later releases.
template <typename StateMap>
typename StateMap::key_type optimizer_state_key(const StateMap&, const at::Tensor& param) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;  // what c10::guts::to_string does for a pointer
    text << param.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

}  // namespace remat::compat
