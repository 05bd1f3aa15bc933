// The caching phase of an image run at Flux.1's real shapes, with random weights (the cost does not
// depend on them): images per second for decode + resize + crop + VAE encode, captions per second
// for CLIP-L + T5-XXL, and the tracked peak of each phase (weights included), as the caching phase
// runs them: one phase at a time, each model freed before the next is built (remat/data/caches.h).
//
//   caching_throughput [--side 512] [--dtype bf16|fp32] [--repeats 3] [--t5_layers 24] [--t5_tokens 512]
//
// The image phase decodes a (9/4 side) x (3/2 side) PNG (a 3:2 picture larger than the bucket),
// resizes it so its shorter edge is `side` (Lanczos, the caching phase's filter), centre-crops side x side and
// encodes it with AutoencoderKLConfig::flux() (the posterior's sample, as the cache stores it).
// The text phase runs CLIP-L on 77 ids and T5 v1.1 XXL's encoder on t5_tokens ids (FluxPipeline's
// shapes; ids random, tokenizers not timed: they take microseconds). --t5_layers below 24 builds
// T5 at its real width with fewer blocks, for machines without the ~9 GiB (bf16) the full
// encoder needs or without the time: the figures are then also given scaled to 24 blocks (time
// per block and weight bytes scale linearly; the activation peak of one block does not grow with
// depth in inference). Medians over `repeats` runs after one warm-up run; one LibTorch thread.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <c10/core/DefaultDtype.h>
#include <torch/torch.h>

#include "remat/data/demo_images.h"
#include "remat/encoders/autoencoder_kl.h"
#include "remat/encoders/clip_text_model.h"
#include "remat/image/image_file.h"
#include "remat/image/png_file.h"
#include "remat/encoders/t5_encoder.h"
#include "remat/memory.h"

namespace {

using namespace remat;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "caching_throughput: %s\nusage: caching_throughput [--side N] [--dtype bf16|fp32] [--repeats N] "
               "[--t5_layers N] [--t5_tokens N]\n",
               why.c_str());
  std::exit(2);
}

// Builds a module with `dtype` as the default dtype, so a bf16 model never exists in fp32 first
// (T5-XXL would need 19 GB for a moment).
template <class Make>
auto build_in(at::ScalarType dtype, Make make) {
  const auto previous = c10::get_default_dtype();
  c10::set_default_dtype(c10::scalarTypeToTypeMeta(dtype));
  auto module = make();
  c10::set_default_dtype(previous);
  module->eval();
  return module;
}

int64_t parameter_bytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const auto& p : module.parameters()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
  return bytes;
}

// A photo-like source picture: a demo shape on a background with pixel noise, so the PNG does not
// compress to nothing and decoding costs what a real picture's does.
std::string write_source_picture(const std::string& dir, int64_t side) {
  data::DemoImage image = data::plan_demo_images({2, 16, 0})[1];
  image.width = side * 9 / 4;
  image.height = side * 3 / 2;
  image.center_x = image.width / 2.0;
  image.center_y = image.height / 2.0;
  image.radius = image.height / 3.0;
  auto picture = data::draw_demo_image(image).to(at::kShort);
  torch::manual_seed(0);
  picture = (picture + torch::randint(-24, 25, picture.sizes(), at::kShort)).clamp(0, 255).to(at::kByte);
  const std::string path = dir + "/source.png";
  image::write_png(path, picture);
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_cpu_tracking();
  torch::set_num_threads(1);
  int64_t side = 512, repeats = 3, t5_layers = 24, t5_tokens = 512;
  std::string dtype_name = "bf16";
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage("missing value after " + flag);
    const std::string value = argv[++i];
    if (flag == "--side") side = std::atoll(value.c_str());
    else if (flag == "--dtype") dtype_name = value;
    else if (flag == "--repeats") repeats = std::atoll(value.c_str());
    else if (flag == "--t5_layers") t5_layers = std::atoll(value.c_str());
    else if (flag == "--t5_tokens") t5_tokens = std::atoll(value.c_str());
    else usage("unknown flag " + flag);
  }
  if (side < 16 || side % 16 != 0 || side > 4096) usage("--side must be a multiple of 16 in [16, 4096]");
  if (dtype_name != "bf16" && dtype_name != "fp32") usage("--dtype must be bf16 or fp32");
  if (repeats < 1 || repeats > 100) usage("--repeats must be in [1, 100]");
  if (t5_layers < 1 || t5_layers > 24) usage("--t5_layers must be in [1, 24]");
  if (t5_tokens < 2 || t5_tokens > 512) usage("--t5_tokens must be in [2, 512]");
  const at::ScalarType dtype = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
  torch::NoGradGuard no_grad;

  const auto dir = std::filesystem::temp_directory_path() / ("remat_caching_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string source = write_source_picture(dir.string(), side);
  std::printf("caching phase at Flux.1's shapes, random weights, %s, 1 LibTorch thread, median of %lld runs "
              "after one warm-up\n\n",
              dtype_name.c_str(), static_cast<long long>(repeats));

  // ---- image phase: decode, resize, crop, VAE encode ----
  {
    memory::PeakScope phase;
    auto vae = build_in(dtype, [] { return encoders::AutoencoderKL(encoders::AutoencoderKLConfig::flux()); });
    const int64_t weights = parameter_bytes(*vae);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
    std::vector<double> decode_s, resize_s, encode_s, total_s;
    at::Tensor latents;
    for (int64_t r = 0; r <= repeats; ++r) {
      const auto t0 = Clock::now();
      const auto picture = image::read_image(source);
      const double t_decode = seconds_since(t0);
      const auto t1 = Clock::now();
      const int64_t resized_w = picture.size(1) * side / picture.size(0);  // shorter edge -> side
      const auto resized = image::resize_picture(picture, resized_w, side);
      const auto cropped = image::crop_picture(resized, (resized_w - side) / 2, 0, side, side);
      const double t_resize = seconds_since(t1);
      const auto t2 = Clock::now();
      const auto posterior = vae->encode(image::picture_to_vae_input(cropped).to(dtype));
      latents = vae->to_transformer_latents(posterior.sample(generator)).to(at::kFloat);
      const double t_encode = seconds_since(t2);
      if (r == 0) continue;  // warm-up
      decode_s.push_back(t_decode);
      resize_s.push_back(t_resize);
      encode_s.push_back(t_encode);
      total_s.push_back(t_decode + t_resize + t_encode);
    }
    const double total = median(total_s);
    std::printf("| image phase (%lldx%lld PNG -> %lldx%lld) | median |\n| --- | --- |\n",
                static_cast<long long>(side * 9 / 4), static_cast<long long>(side * 3 / 2),
                static_cast<long long>(side), static_cast<long long>(side));
    std::printf("| decode (PNG) | %.3f s |\n| resize + crop | %.3f s |\n| VAE encode | %.2f s |\n",
                median(decode_s), median(resize_s), median(encode_s));
    std::printf("| **images / second** | **%.4f** (%.2f s per image) |\n", 1.0 / total, total);
    std::printf("| VAE weights | %s |\n| phase peak (weights + one image) | %s |\n| latents | (%lld, %lld, %lld) |\n\n",
                memory::format_bytes(weights).c_str(), memory::format_bytes(phase.peak_delta()).c_str(),
                static_cast<long long>(latents.size(1)), static_cast<long long>(latents.size(2)),
                static_cast<long long>(latents.size(3)));
    std::fflush(stdout);
  }  // the VAE is freed here, before the text encoders are built

  // ---- text phase: CLIP-L (77 ids, pooled) and T5 (t5_tokens ids) ----
  {
    memory::PeakScope phase;
    auto clip = build_in(dtype, [] { return encoders::ClipTextModel(encoders::ClipTextConfig::clip_l()); });
    auto t5_config = encoders::T5Config::t5_v1_1_xxl();
    const int64_t full_layers = t5_config.num_layers;
    t5_config.num_layers = t5_layers;
    auto t5 = build_in(dtype, [&] { return encoders::T5EncoderModel(t5_config); });
    const int64_t clip_weights = parameter_bytes(*clip), t5_weights = parameter_bytes(*t5);
    std::vector<double> clip_s, t5_s;
    for (int64_t r = 0; r <= repeats; ++r) {
      auto clip_ids = torch::randint(1, 49406, {1, 77}, at::kLong);
      auto t5_ids = torch::randint(3, t5_config.vocab_size, {1, t5_tokens}, at::kLong);
      const auto t0 = Clock::now();
      const auto pooled = clip->forward(clip_ids).pooled_output;
      const double t_clip = seconds_since(t0);
      const auto t1 = Clock::now();
      const auto embeds = t5->forward(t5_ids);
      const double t_t5 = seconds_since(t1);
      if (r == 0) continue;
      clip_s.push_back(t_clip);
      t5_s.push_back(t_t5);
    }
    const double clip_m = median(clip_s), t5_m = median(t5_s);
    const double scale = static_cast<double>(full_layers) / static_cast<double>(t5_layers);
    const int64_t peak = phase.peak_delta();
    std::printf("| text phase (CLIP-L 77 ids + T5 %lld ids) | measured (T5 with %lld of %lld blocks) |%s\n",
                static_cast<long long>(t5_tokens), static_cast<long long>(t5_layers),
                static_cast<long long>(full_layers), t5_layers < full_layers ? " scaled to 24 blocks |" : "");
    std::printf("| --- | --- |%s\n", t5_layers < full_layers ? " --- |" : "");
    const auto row = [&](const char* name, const std::string& measured, const std::string& scaled) {
      std::printf("| %s | %s |%s\n", name, measured.c_str(), t5_layers < full_layers ? (" " + scaled + " |").c_str() : "");
    };
    char buffer[64];
    const auto fmt = [&](const char* format, double value) {
      std::snprintf(buffer, sizeof(buffer), format, value);
      return std::string(buffer);
    };
    row("CLIP-L forward", fmt("%.3f s", clip_m), fmt("%.3f s", clip_m));
    row("T5 forward", fmt("%.2f s", t5_m), fmt("%.1f s", t5_m * scale));
    row("**captions / second**", fmt("**%.4f**", 1.0 / (clip_m + t5_m)), fmt("**%.4f**", 1.0 / (clip_m + t5_m * scale)));
    row("CLIP-L weights", memory::format_bytes(clip_weights), memory::format_bytes(clip_weights));
    // Scaling all of T5's bytes by blocks overstates the shared embedding (32128 x 4096): add it back once.
    const int64_t embedding = t5_config.vocab_size * t5_config.d_model * static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t t5_full = t5_layers < full_layers
                                ? embedding + static_cast<int64_t>(static_cast<double>(t5_weights - embedding) * scale)
                                : t5_weights;
    row("T5 weights", memory::format_bytes(t5_weights), memory::format_bytes(t5_full));
    row("phase peak (weights + one caption)", memory::format_bytes(peak),
        memory::format_bytes(peak - t5_weights + t5_full));
    std::fflush(stdout);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
