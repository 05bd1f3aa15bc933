#include "remat/encoders/activations.h"

#include <ATen/core/grad_mode.h>

#include "python_number.h"

namespace remat::encoders {

namespace {

using detail::python_number;

// True when autograd would record an op on x: then an in-place chain would overwrite tensors
// saved for backward, and the out-of-place form runs instead.
bool autograd_records(const at::Tensor& x) { return at::GradMode::is_enabled() && x.requires_grad(); }

}  // namespace

at::Tensor quick_gelu(const at::Tensor& x) { return x * at::sigmoid(x * 1.702); }

at::Tensor quick_gelu_consuming(at::Tensor x) {
  if (autograd_records(x)) return quick_gelu(x);
  // The same ops in the same order (x * 1.702, sigmoid, x * s): s * x rounds as x * s does.
  at::Tensor s = x * 1.702;
  s.sigmoid_();
  return s.mul_(x);
}

at::Tensor gelu_new(const at::Tensor& x) {
  // sqrt(2 / pi), the constant transformers writes as math.sqrt(2.0 / math.pi).
  constexpr double kSqrtTwoOverPi = 0.7978845608028654;
  const at::Tensor inner = (x + x.pow(3.0) * 0.044715) * kSqrtTwoOverPi;
  return (x * 0.5) * (at::tanh(inner) + 1.0);
}

at::Tensor gelu_new_consuming(at::Tensor x) {
  if (autograd_records(x)) return gelu_new(x);
  constexpr double kSqrtTwoOverPi = 0.7978845608028654;
  // gelu_new's ops in its order, each rounded as there (the numbers as Python passes them, see
  // python_number.h), in two buffers instead of up to five:
  // x^3 * 0.044715 + x (= x + ...), * sqrt(2/pi), tanh, + 1; then x * 0.5 in x's own storage.
  at::Tensor t = x.pow(3.0);
  t.mul_(python_number(0.044715)).add_(x).mul_(python_number(kSqrtTwoOverPi)).tanh_().add_(python_number(1.0));
  return x.mul_(python_number(0.5)).mul_(t);
}

}  // namespace remat::encoders
