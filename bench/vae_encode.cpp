// Flux VAE encode: time and tracked peak memory for one image (docs/VAE.md, "Benchmark").
// Random weights of the Flux shape (AutoencoderKLConfig::flux()), one CPU thread. For each case:
// wall time of one encode (mean and logvar) and the peak of remat's CPU allocator tracking above
// the bytes held before the call (weights and input excluded).
//
// usage: vae_encode [cases=512:fp32:off,512:fp32:tiled,1024:fp32:off,1024:fp32:tiled,...]
//   a case is <side>:<fp32|bf16>:<off|tiled>[:nchw|nhwc]; tiled runs use tiles of side/2 pixels,
//   so the image is cut into 3 x 3 tiles (stride 0.75 x tile) and the peak is that of one tile;
//   nhwc runs with channels-last convolutions (fp32 only; nchw, the default, without).

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "remat/encoders/autoencoder_kl.h"
#include "remat/memory.h"

using namespace remat;
using namespace remat::encoders;

int main(int argc, char** argv) {
  memory::install_cpu_tracking();
  torch::set_num_threads(1);
  const std::string cases = argc > 1 ? argv[1]
                                     : "512:fp32:off,512:fp32:tiled,1024:fp32:off,1024:fp32:tiled,"
                                       "512:bf16:off,512:bf16:tiled,1024:bf16:off,1024:bf16:tiled";
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  AutoencoderKL vae(AutoencoderKLConfig::flux());
  vae->eval();
  std::printf("| image | dtype | tiling | encode time | peak above weights + input |\n| --- | --- | --- | --- | --- |\n");
  std::fflush(stdout);
  std::stringstream list(cases);
  std::string item;
  while (std::getline(list, item, ',')) {
    const auto c1 = item.find(':'), c2 = item.find(':', c1 + 1);
    const int64_t side = std::stoll(item.substr(0, c1));
    const auto c3 = item.find(':', c2 + 1);
    const std::string dtype_name = item.substr(c1 + 1, c2 - c1 - 1), tiling = item.substr(c2 + 1, c3 - c2 - 1);
    const bool nhwc = c3 != std::string::npos && item.substr(c3 + 1) == "nhwc";
    const at::ScalarType dtype = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
    vae->set_channels_last(false);
    vae->to(dtype);
    vae->set_channels_last(nhwc);
    vae->set_tiling(tiling == "tiled");
    vae->set_tile_sample_size(side / 2);
    const at::Tensor x = (torch::rand({1, 3, side, side}) * 2 - 1).to(dtype);
    memory::PeakScope scope;
    const auto start = std::chrono::steady_clock::now();
    const DiagonalGaussian posterior = vae->encode(x);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int64_t peak = scope.peak_delta();
    std::printf("| %lldx%lld | %s%s | %s | %.1f s | %s |\n", static_cast<long long>(side), static_cast<long long>(side),
                dtype_name.c_str(), nhwc ? " NHWC" : "", tiling == "tiled" ? ("tiles of " + std::to_string(side / 2) + " px").c_str() : "off",
                seconds, memory::format_bytes(peak).c_str());
    std::fflush(stdout);
  }
  return 0;
}
