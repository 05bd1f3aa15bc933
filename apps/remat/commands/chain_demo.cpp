// `remat chain-demo`: checkpoints a chain of residual MLP blocks at segment sizes off, 1, 2 and 4 and
// prints the tracked peak memory and the median training-step time of each, side by side.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "command.h"
#include "parse_args.h"
#include "remat/threads.h"
#include "remat/checkpoint.h"
#include "remat/memory.h"

namespace remat::cli {
namespace {

struct DemoChain : torch::nn::Module {
  DemoChain(int64_t blocks, int64_t width) {
    for (int64_t i = 0; i < blocks; ++i) {
      up.push_back(register_module("up" + std::to_string(i), torch::nn::Linear(width, 4 * width)));
      down.push_back(register_module("down" + std::to_string(i), torch::nn::Linear(4 * width, width)));
    }
  }
  Tensors block(int64_t i, const Tensors& state) {
    return {state[0] + down[i]->forward(torch::gelu(up[i]->forward(state[0]), "tanh"))};
  }
  std::vector<torch::nn::Linear> up, down;
};

int run_demo(const std::vector<std::string>& args) {
  CLI::App app{"Checkpoint a chain of MLP blocks at segment sizes off/1/2/4; print peak memory "
               "and step time.",
               "remat chain-demo"};
  int64_t blocks = 8, width = 256, tokens = 4096, steps = 5;
  int threads = 1;  // OpenBLAS threads the matmuls itself (docs/PERFORMANCE.md, "Threads")
  app.add_option("--blocks", blocks, "Number of blocks in the chain")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--width", width, "Block width (hidden 4x)")->check(CLI::Range(1, 65536))->capture_default_str();
  app.add_option("--tokens", tokens, "Rows of the input")->check(CLI::Range(1, 1 << 24))->capture_default_str();
  app.add_option("--steps", steps, "Timed steps per layout (median reported)")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--threads", threads, "CPU threads")->check(CLI::Range(1, 256))->capture_default_str();
  if (auto code = parse_or_exit(app, args)) return *code;
  set_cpu_threads(threads);
  torch::manual_seed(0);
  DemoChain chain(blocks, width);
  const auto x = torch::randn({tokens, width});

  struct Layout { std::string name; int64_t segment; };
  const std::vector<Layout> layouts{{"off", 0}, {"1", 1}, {"2", 2}, {"4", 4}};
  std::vector<std::vector<double>> times(layouts.size());
  std::vector<int64_t> peaks(layouts.size(), 0);

  const auto step = [&](const Layout& layout) {
    chain.zero_grad();
    auto input = x.clone().requires_grad_(true);
    const RunBlock run = [&](int64_t i, const Tensors& s) { return chain.block(i, s); };
    Tensors out;
    if (layout.segment == 0) {
      out = {input};
      for (int64_t i = 0; i < blocks; ++i) out = run(i, out);
    } else {
      out = checkpoint_sequential_state(blocks, layout.segment, {input}, run);
    }
    out[0].pow(2).mean().backward();
  };

  // Interleave the layouts so machine noise hits all of them alike; the first round warms up.
  for (int64_t round = 0; round <= steps; ++round) {
    for (size_t l = 0; l < layouts.size(); ++l) {
      memory::PeakScope scope;
      const auto start = std::chrono::steady_clock::now();
      step(layouts[l]);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round > 0) times[l].push_back(seconds);
      peaks[l] = std::max(peaks[l], scope.peak_delta());
    }
  }
  std::printf("chain: %lld residual MLP blocks, width %lld, %lld tokens, fp32, %d threads\n",
              static_cast<long long>(blocks), static_cast<long long>(width),
              static_cast<long long>(tokens), threads);
  std::printf("%-10s %16s %14s %12s\n", "segment", "peak above start", "median step", "vs off");
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double base = median(times[0]);
  for (size_t l = 0; l < layouts.size(); ++l) {
    const double t = median(times[l]);
    std::printf("%-10s %16s %12.1f ms %11.2fx\n", layouts[l].name.c_str(),
                memory::format_bytes(peaks[l]).c_str(), t * 1e3, t / base);
  }
  return 0;
}

REMAT_COMMAND("chain-demo", "checkpoint a chain of MLP blocks at segment sizes off/1/2/4 (peak, time)",
              run_demo);

}  // namespace
}  // namespace remat::cli
