#include "remat/encoders/activations.h"

namespace remat::encoders {

at::Tensor quick_gelu(const at::Tensor& x) { return x * at::sigmoid(x * 1.702); }

at::Tensor gelu_new(const at::Tensor& x) {
  // sqrt(2 / pi), the constant transformers writes as math.sqrt(2.0 / math.pi).
  constexpr double kSqrtTwoOverPi = 0.7978845608028654;
  const at::Tensor inner = (x + x.pow(3.0) * 0.044715) * kSqrtTwoOverPi;
  return (x * 0.5) * (at::tanh(inner) + 1.0);
}

}  // namespace remat::encoders
