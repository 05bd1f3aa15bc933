// What keeping or reloading the VAE costs a training run with validation images (remat/train/
// validation_images.h loads it for each validation and frees it after decoding). At Flux.1's real
// VAE shape (AutoencoderKLConfig::flux(), random weights: the cost does not depend on them):
// the resident bytes a kept VAE would hold through every training step, the time to load it from
// a safetensors file (what each validation pays instead), and the time of one decode at the
// validation resolution, for scale. Medians over `repeats` loads after one warm-up (the file is
// then in the page cache, as it is for the second and later validations of a run); one LibTorch
// thread unless --threads.
//
//   validation_vae_cost [--dtype bf16|fp32] [--side 256] [--repeats 5] [--threads 1]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <torch/torch.h>

#include "remat/encoders/autoencoder_kl.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"

namespace {

using namespace remat;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_cpu_tracking();
  std::string dtype_name = "bf16";
  int64_t side = 256;
  int repeats = 5;
  int threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dtype") dtype_name = argv[i + 1];
    else if (flag == "--side") side = std::atoll(argv[i + 1]);
    else if (flag == "--repeats") repeats = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--threads") threads = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  torch::set_num_threads(threads);
  const at::ScalarType dtype = dtype_name == "fp32" ? at::kFloat : at::kBFloat16;
  const auto config = encoders::AutoencoderKLConfig::flux();
  const auto dir = std::filesystem::temp_directory_path() / ("validation_vae_cost_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "diffusion_pytorch_model.safetensors").string();
  {
    torch::NoGradGuard no_grad;
    encoders::AutoencoderKL vae(config);
    vae->to(dtype);
    std::vector<io::NamedTensor> tensors;
    for (const auto& item : vae->named_parameters()) tensors.emplace_back(item.key(), item.value());
    for (const auto& item : vae->named_buffers()) tensors.emplace_back(item.key(), item.value());
    io::save_safetensors(file, tensors, {});
  }

  std::vector<double> loads;
  int64_t resident = 0;
  for (int r = 0; r <= repeats; ++r) {
    const int64_t before = memory::current_bytes();
    const auto start = Clock::now();
    auto vae = encoders::load_autoencoder_kl(file, config, dtype);
    const double t = seconds_since(start);
    resident = memory::current_bytes() - before;
    if (r > 0) loads.push_back(t);  // run 0 warms the page cache
  }

  torch::NoGradGuard no_grad;
  auto vae = encoders::load_autoencoder_kl(file, config, dtype);
  vae->eval();
  const int64_t f = int64_t{1} << (config.num_blocks() - 1);
  const auto latents = torch::randn({1, config.latent_channels, side / f, side / f}).to(dtype);
  vae->decode(latents);  // warm-up
  const auto start = Clock::now();
  vae->decode(latents);
  const double decode = seconds_since(start);
  std::filesystem::remove_all(dir);

  std::printf("Flux VAE (%s), %d thread(s)\n", dtype_name.c_str(), threads);
  std::printf("  resident while kept:        %s\n", memory::format_bytes(resident).c_str());
  std::printf("  load (median of %d):        %.3f s\n", repeats, median(loads));
  std::printf("  one decode at %lldx%lld:     %.3f s\n", static_cast<long long>(side), static_cast<long long>(side), decode);
  return 0;
}
