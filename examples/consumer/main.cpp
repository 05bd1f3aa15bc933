// Checkpoints a two-segment chain with the installed library and checks the gradient against
// running without checkpointing. Exit code 0 on agreement.
#include <cstdio>

#include <torch/torch.h>

#include <remat/checkpoint.h>

int main() {
  torch::manual_seed(0);
  auto w = torch::randn({8, 8}, torch::requires_grad());
  auto x = torch::randn({4, 8}, torch::requires_grad());
  const remat::RunBlock block = [&](int64_t, const remat::Tensors& s) {
    return remat::Tensors{torch::tanh(s[0].matmul(w))};
  };

  remat::Tensors direct{x};
  for (int64_t i = 0; i < 4; ++i) direct = block(i, direct);
  const auto expected = torch::autograd::grad({direct[0].sum()}, {w})[0];

  auto out = remat::checkpoint_sequential_state(4, 2, {x}, block);
  const auto got = torch::autograd::grad({out[0].sum()}, {w})[0];
  // w is shared by all blocks: its gradient is summed in another order (per segment first), so
  // compare to rounding, not bitwise.
  const bool ok = torch::allclose(expected, got, /*rtol=*/1e-5, /*atol=*/1e-6);
  std::printf("consumer: checkpointed gradient %s the direct one (max diff %.3g)\n",
              ok ? "matches" : "DIFFERS FROM", (expected - got).abs().max().item<double>());
  return ok ? 0 : 1;
}
