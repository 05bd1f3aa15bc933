// MageFlow's encoders at their published sizes with random weights, on this CPU: Mage-VAE encode and
// decode of one picture, and Qwen3-VL-4B's language model on one caption (docs/MAGEFLOW_PARITY.md,
// "Benchmark"). For each case: the weights' bytes, the median wall time of `repeats` runs and the
// peak of remat's CPU allocator tracking above the bytes held before the call (weights and input
// excluded). The language model runs `layers` of its 36 layers (building all 36 in bfloat16 takes
// 8 GB and minutes to initialise); its per-layer time and peak are reported with the 36-layer
// figure they give.
//
// usage: mageflow_encoders [side=512] [layers=4 (>= 2)] [tokens=48] [repeats=3] [threads=1]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "remat/default_dtype.h"
#include "remat/encoders/mage_vae.h"
#include "remat/encoders/qwen3_text_model.h"
#include "remat/memory.h"

using namespace remat;
using namespace remat::encoders;

namespace {

struct Measure {
  double median_seconds = 0;
  int64_t peak_bytes = 0;
};

Measure measure(int repeats, const std::function<void()>& work) {
  std::vector<double> times;
  int64_t peak = 0;
  for (int r = 0; r < repeats; ++r) {
    memory::PeakScope scope;
    const auto start = std::chrono::steady_clock::now();
    work();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    peak = std::max(peak, scope.peak_delta());
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], peak};
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t side = argc > 1 ? std::stoll(argv[1]) : 512;
  const int64_t layers = argc > 2 ? std::stoll(argv[2]) : 4;
  const int64_t tokens = argc > 3 ? std::stoll(argv[3]) : 48;
  const int repeats = argc > 4 ? std::stoi(argv[4]) : 3;
  const int threads = argc > 5 ? std::stoi(argv[5]) : 1;
  memory::install_cpu_tracking();
  torch::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  std::printf("threads %d, median of %d\n\n| model | dtype | work | weights | time | peak above weights + input |\n"
              "| --- | --- | --- | --- | --- | --- |\n", threads, repeats);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const char* name = dtype == at::kFloat ? "fp32" : "bf16";
    MageVae vae = MageVae::random(MageVaeConfig::preset("mage-vae"), 0, 0.02, dtype);
    const at::Tensor pixels = (torch::rand({1, 3, side, side}) * 2 - 1).to(dtype);
    at::Tensor latents;
    const Measure enc = measure(repeats, [&] { latents = vae.encode(pixels); });
    const Measure dec = measure(repeats, [&] { vae.decode(latents); });
    const std::string weights = memory::format_bytes(vae.parameter_bytes());
    std::printf("| Mage-VAE | %s | encode %lldx%lld | %s | %.2f s | %s |\n", name, static_cast<long long>(side),
                static_cast<long long>(side), weights.c_str(), enc.median_seconds, memory::format_bytes(enc.peak_bytes).c_str());
    std::printf("| Mage-VAE | %s | decode to %lldx%lld | %s | %.2f s | %s |\n", name, static_cast<long long>(side),
                static_cast<long long>(side), weights.c_str(), dec.median_seconds, memory::format_bytes(dec.peak_bytes).c_str());
    std::fflush(stdout);
  }
  Qwen3TextConfig config;  // Qwen3-VL-4B's language model
  const int64_t all_layers = config.num_hidden_layers;
  config.num_hidden_layers = layers;
  Qwen3TextModel model{nullptr};
  {
    DefaultDtypeGuard guard(at::kBFloat16);  // built in bfloat16 directly, as it loads
    model = Qwen3TextModel(config);
  }
  model->eval();
  int64_t weight_bytes = 0;
  for (const auto& p : model->parameters()) weight_bytes += static_cast<int64_t>(p.nbytes());
  const at::Tensor ids = torch::randint(0, config.vocab_size, {1, tokens}, at::kLong);
  const Measure text = measure(repeats, [&] { model->forward(ids); });
  // One layer too: the difference per layer, and what is outside the layers (embedding, norm, RoPE).
  config.num_hidden_layers = 1;
  Qwen3TextModel one{nullptr};
  {
    DefaultDtypeGuard guard(at::kBFloat16);
    one = Qwen3TextModel(config);
  }
  const Measure single = measure(repeats, [&] { one->forward(ids); });
  const double per_layer = layers > 1 ? (text.median_seconds - single.median_seconds) / static_cast<double>(layers - 1)
                                      : single.median_seconds;
  config.num_hidden_layers = all_layers;
  std::printf("| Qwen3-VL-4B text, %lld of %lld layers | bf16 | %lld tokens | %s | %.2f s | %s |\n",
              static_cast<long long>(layers), static_cast<long long>(all_layers), static_cast<long long>(tokens),
              memory::format_bytes(weight_bytes).c_str(), text.median_seconds,
              memory::format_bytes(text.peak_bytes).c_str());
  std::printf("| Qwen3-VL-4B text, all %lld layers (scaled: the 1-layer time %.3f s + %lld x %.3f s per further layer) "
              "| bf16 | %lld tokens | %s | %.1f s | %s (layers run one after another: the same peak) |\n",
              static_cast<long long>(all_layers), single.median_seconds, static_cast<long long>(all_layers - 1), per_layer,
              static_cast<long long>(tokens), memory::format_bytes(config.parameter_count() * 2).c_str(),
              single.median_seconds + per_layer * static_cast<double>(all_layers - 1),
              memory::format_bytes(text.peak_bytes).c_str());
  return 0;
}
