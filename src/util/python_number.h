#pragma once
// A number operand as PyTorch's Python API hands it to a binary op (`t * 0.5`, `t.mul_(0.5)`): a
// 0-dim double tensor marked as a wrapped number. TensorIterator then computes a bf16 or fp16 op
// in float with the number's float value (its CPU-scalar path), as `tensor * 0.5` does in C++ too.
// The in-place Scalar overloads of the C++ API (`t.mul_(0.5)`) instead cast the number to the
// tensor's dtype first on LibTorch 2.x, which rounds differently: an in-place rewrite of an
// upstream Python expression passes its numbers through this to keep upstream's bits.

#include <ATen/ATen.h>

namespace remat::detail {

inline at::Tensor python_number(double value) {
  at::Tensor number = at::scalar_tensor(value, at::kDouble);
  number.unsafeGetTensorImpl()->set_wrapped_number(true);
  return number;
}

}  // namespace remat::detail
