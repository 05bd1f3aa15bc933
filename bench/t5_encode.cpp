// T5 text encoding as Flux.1 runs it: T5 v1.1 XXL (text_encoder_2) in bf16 with random weights,
// one caption padded to 512 tokens (Flux.1-dev) and 256 (schnell), no attention mask (as
// FluxPipeline calls it). Prints the weights' memory, the time per forward and the tracked peak
// above the weights (remat's CPU allocator tracking, include/remat/memory.h).
//
// Usage: t5_encode [xxl|tiny] [lengths, comma-separated; default 512,256] [threads; default 1]
// XXL needs ~9 GiB of memory for the weights; on CPU a 512-token forward takes minutes.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <c10/core/DefaultDtype.h>
#include <torch/torch.h>

#include "remat/encoders/t5_encoder.h"
#include "remat/memory.h"

using namespace remat;

int main(int argc, char** argv) {
  memory::install_cpu_tracking();
  const std::string preset = argc > 1 ? argv[1] : "xxl";
  std::vector<int64_t> lengths;
  {
    std::stringstream list(argc > 2 ? argv[2] : "512,256");
    for (std::string item; std::getline(list, item, ',');) lengths.push_back(std::atoll(item.c_str()));
  }
  torch::set_num_threads(argc > 3 ? std::atoi(argv[3]) : 1);
  TORCH_CHECK_VALUE(preset == "xxl" || preset == "tiny", "preset must be xxl or tiny, got ", preset);
  const encoders::T5Config config =
      preset == "xxl" ? encoders::T5Config::t5_v1_1_xxl() : encoders::T5Config::tiny();

  // Built directly in bf16 (the default dtype while constructing): an fp32 XXL would need 19 GB.
  torch::manual_seed(0);
  const auto default_dtype = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::Make<c10::BFloat16>());
  const auto start_build = std::chrono::steady_clock::now();
  encoders::T5EncoderModel model(config);
  c10::set_default_dtype(default_dtype);
  model->eval();
  const double build_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_build).count();
  const int64_t weights = memory::current_bytes();
  std::printf("T5 %s (%lld parameters, bf16): weights %s (expected %s), built in %.1f s, %d thread(s)\n",
              preset.c_str(), static_cast<long long>(encoders::parameter_count(config)),
              memory::format_bytes(weights).c_str(),
              memory::format_bytes(2 * encoders::parameter_count(config)).c_str(), build_s,
              torch::get_num_threads());
  std::printf("| tokens | forward time | peak above weights | output |\n|---|---|---|---|\n");

  torch::NoGradGuard no_grad;
  for (const int64_t L : lengths) {
    // One caption: ~20 content ids, </s>, then pads to L (the pads are attended to, as in Flux).
    auto ids = torch::zeros({1, L}, torch::kLong);
    ids.narrow(1, 0, std::min<int64_t>(20, L - 1)).random_(3, config.vocab_size);
    ids[0][std::min<int64_t>(20, L - 1)] = 1;
    memory::PeakScope scope;
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor out = model->forward(ids);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("| %lld | %.2f s | %s | (%lld, %lld, %lld) %s |\n", static_cast<long long>(L), seconds,
                memory::format_bytes(scope.peak_delta()).c_str(), static_cast<long long>(out.size(0)),
                static_cast<long long>(out.size(1)), static_cast<long long>(out.size(2)),
                c10::toString(out.scalar_type()));
    std::fflush(stdout);
  }
  return 0;
}
