// remat's side of bench/compare_inference.py: one inference case on weights and an input that the
// script wrote in diffusers' layout, timed and measured the way the script measures diffusers.
//
// usage: inference_compare <work_dir> <vae-encode|vae-decode> <fp32|bf16> <threads>
//   reads  <work_dir>/vae/config.json, <work_dir>/vae/diffusion_pytorch_model.safetensors,
//          <work_dir>/input.safetensors ("input": the image, or the latents to decode)
//   writes <work_dir>/output_remat.safetensors ("output": the posterior mean, or the picture)
//   prints one JSON line: seconds, tracked_peak (remat's CPU allocator, bytes above the start of
//          the work: weights and input excluded), rss_peak (VmHWM above the RSS at the start)
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include "remat/encoders/autoencoder_kl.h"
#include "remat/encoders/autoencoder_kl_config.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "remat/threads.h"

namespace {

// A line of /proc/self/status ("VmRSS:  1234 kB"), in bytes.
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  }
  return -1;
}

// Resets VmHWM to the current RSS (Linux: proc(5), /proc/pid/clear_refs, value 5).
void reset_rss_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: inference_compare <work_dir> <vae-encode|vae-decode> <fp32|bf16> <threads>\n");
    return 2;
  }
  const std::string dir = argv[1], work = argv[2], dtype_name = argv[3];
  remat::memory::install_cpu_tracking();
  remat::set_cpu_threads(std::stoll(argv[4]));
  const at::ScalarType dtype = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
  torch::NoGradGuard no_grad;

  const auto config = remat::encoders::AutoencoderKLConfig::from_file(dir + "/vae/config.json");
  auto vae = remat::encoders::load_autoencoder_kl(dir + "/vae/diffusion_pytorch_model.safetensors", config, dtype);
  const at::Tensor input = remat::io::SafetensorsFile::open(dir + "/input.safetensors").tensor("input", dtype);

  reset_rss_peak();
  const int64_t rss_start = status_bytes("VmRSS");
  remat::memory::PeakScope scope;
  const auto start = std::chrono::steady_clock::now();
  at::Tensor output = work == "vae-encode" ? vae->encode(input).mean : vae->decode(input);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t tracked = scope.peak_delta(), rss = status_bytes("VmHWM") - rss_start;

  remat::io::save_safetensors(dir + "/output_remat.safetensors", {{"output", output.to(at::kFloat)}});
  std::printf("{\"seconds\": %.6f, \"tracked_peak\": %lld, \"rss_peak\": %lld}\n", seconds,
              static_cast<long long>(tracked), static_cast<long long>(rss));
  return 0;
}
