// Checkpoint overhead: how much a training step with per-block checkpointing costs beyond the
// recomputation it must do. Prints, for a chain of transformer-like blocks,
//   ratio = step(per-block checkpointing) / (step(no checkpointing) + forward(all blocks))
// where forward is timed with grad enabled, as recomputation runs. 1.00 means the checkpoint
// machinery itself is free. Layouts are interleaved and the median of each is reported.
//
// usage: checkpoint_overhead [blocks=8] [tokens=512] [width=256] [steps=10] [threads=1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include <torch/torch.h>

#include "remat/checkpoint.h"
#include "remat/memory.h"

namespace {

using remat::Tensors;

// Pre-norm attention + MLP block on (B, L, D): the shape of work of a DiT block.
struct Block : torch::nn::Module {
  Block(int64_t width, int64_t heads) : heads(heads) {
    qkv = register_module("qkv", torch::nn::Linear(width, 3 * width));
    out = register_module("out", torch::nn::Linear(width, width));
    up = register_module("up", torch::nn::Linear(width, 4 * width));
    down = register_module("down", torch::nn::Linear(4 * width, width));
  }
  torch::Tensor forward(torch::Tensor x) {
    const auto b = x.size(0), l = x.size(1), d = x.size(2);
    auto h = torch::layer_norm(x, {d});
    auto parts = qkv->forward(h).view({b, l, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
    auto scores = torch::matmul(parts[0], parts[1].transpose(-2, -1)) / std::sqrt(double(d / heads));
    auto attn = torch::matmul(torch::softmax(scores, -1), parts[2]).transpose(1, 2).reshape({b, l, d});
    x = x + out->forward(attn);
    return x + down->forward(torch::gelu(up->forward(torch::layer_norm(x, {d})), "tanh"));
  }
  int64_t heads;
  torch::nn::Linear qkv{nullptr}, out{nullptr}, up{nullptr}, down{nullptr};
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  remat::memory::install_cpu_tracking();
  const auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  const int64_t blocks = arg(1, 8), tokens = arg(2, 512), width = arg(3, 256), steps = arg(4, 10);
  torch::set_num_threads(static_cast<int>(arg(5, 1)));  // see docs/PERFORMANCE.md, "Threads"
  torch::manual_seed(0);

  std::vector<std::shared_ptr<Block>> chain;
  for (int64_t i = 0; i < blocks; ++i) chain.push_back(std::make_shared<Block>(width, 4));
  const auto x = torch::randn({1, tokens, width});
  const remat::RunBlock run = [&](int64_t i, const Tensors& s) { return Tensors{chain[i]->forward(s[0])}; };
  const auto zero_grads = [&] {
    for (auto& b : chain) b->zero_grad(/*set_to_none=*/true);
  };

  const auto step_off = [&] {
    Tensors s{x.clone().requires_grad_()};
    for (int64_t i = 0; i < blocks; ++i) s = run(i, s);
    s[0].pow(2).mean().backward();
  };
  const auto step_checkpointed = [&] {
    Tensors s{x.clone().requires_grad_()};
    s = remat::checkpoint_sequential_state(blocks, 1, s, run);
    s[0].pow(2).mean().backward();
  };
  const auto forward_with_grad = [&] {
    Tensors s{x.clone().requires_grad_()};
    for (int64_t i = 0; i < blocks; ++i) s = run(i, s);
  };

  const std::vector<std::pair<const char*, std::function<void()>>> cases{
      {"no checkpointing: step", step_off},
      {"per-block checkpointing: step", step_checkpointed},
      {"forward alone (grad enabled)", forward_with_grad}};
  std::vector<std::vector<double>> times(cases.size());
  std::vector<int64_t> peaks(cases.size(), 0);
  for (int64_t round = 0; round <= steps; ++round) {  // round 0 warms up
    for (size_t c = 0; c < cases.size(); ++c) {
      zero_grads();
      remat::memory::PeakScope scope;
      const auto start = std::chrono::steady_clock::now();
      cases[c].second();
      const double t = seconds_since(start);
      if (round > 0) times[c].push_back(t);
      peaks[c] = std::max(peaks[c], scope.peak_delta());
    }
  }

  std::printf("checkpoint overhead: %lld blocks, (1, %lld, %lld) fp32, %d threads, %lld steps\n",
              static_cast<long long>(blocks), static_cast<long long>(tokens),
              static_cast<long long>(width), torch::get_num_threads(), static_cast<long long>(steps));
  for (size_t c = 0; c < cases.size(); ++c) {
    std::printf("  %-32s median %8.2f ms   peak %s\n", cases[c].first, median(times[c]) * 1e3,
                remat::memory::format_bytes(peaks[c]).c_str());
  }
  const double off = median(times[0]), ckpt = median(times[1]), fwd = median(times[2]);
  std::printf("  ratio checkpointed / (off + forward) = %.3f\n", ckpt / (off + fwd));
  std::printf("  ratio checkpointed / off             = %.3f\n", ckpt / off);
  return 0;
}
