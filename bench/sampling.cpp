// Sampling (remat/sample/flux_sampler.h denoise) on the CPU: seconds per denoising step and the tracked
// peak, in three parts (docs/PERFORMANCE.md, "Sampling"):
//   small  flux-small (random weights, fp32) at 256, 512 and 1024 pixels: median seconds per
//          step and the tracked peak of the whole denoising loop above the weights.
//   dev    the real FLUX.1-dev shape (hidden 3072, 24 heads): its 11.9 B weights do not fit this
//          machine's memory (25.3 GB) in fp32 (47.6 GB) nor, beside anything else, in bf16 (23.8 GB), so one double-
//          and one single-stream block are measured at a resolution (default 1024 x 1024: 4096
//          image tokens + 512 text tokens) in fp32 and bf16, and the full model's step is
//          extrapolated as 19 double + 38 single blocks (labelled as an extrapolation).
//   share  a demo-sized training step (flux-small LoRA rank 16 "all", batch 4 of 32-pixel pictures,
//          checkpointing interval 2, AdamW) beside one validation image at the demo's size
//          (validation_num_inference_steps 30, the demo VAE decoding), and sampling's share of a
//          run that validates every N steps.
// usage: sampling [small|dev|share|all] [dev_pixels=1024] [dev_repeats=1]
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "remat/encoders/autoencoder_kl.h"
#include "remat/encoders/demo_pipeline.h"
#include "remat/memory.h"
#include "remat/models/blocks.h"
#include "remat/models/flux.h"
#include "remat/sample/flux_sampler.h"
#include "remat/sample/scheduler.h"
#include "remat/train/family/transformer.h"

namespace {

using namespace remat;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Process CPU seconds (every thread: LibTorch's one and OpenBLAS's own, docs/PERFORMANCE.md
// "Threads"): the work itself, which other processes sharing the machine do not inflate as they
// inflate the wall clock. On a quiet 2-core machine the wall time lies between this / 2 and this.
double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

int64_t parameter_bytes(const torch::nn::Module& m) {
  int64_t total = 0;
  for (const auto& p : m.parameters()) total += p.numel() * static_cast<int64_t>(p.element_size());
  return total;
}

sample::PromptEmbeddings random_prompt(const models::FluxConfig& c, int64_t text_tokens) {
  return {torch::randn({text_tokens, c.joint_attention_dim}), torch::randn({c.pooled_projection_dim})};
}

// Median seconds per denoising step (from the step callback's timestamps) and the tracked peak
// of the loop above what was live before it.
struct LoopFigures {
  double step_seconds = 0;
  double step_cpu_seconds = 0;
  int64_t peak_bytes = 0;
  double total_seconds = 0;
  at::Tensor latents;
};

LoopFigures time_denoise(models::FluxImpl& model, const sample::PromptEmbeddings& prompt,
                         const sample::SamplingSettings& settings) {
  std::vector<double> steps, cpu_steps;
  double last_cpu = cpu_seconds();
  auto last = Clock::now();
  const auto start = last;
  memory::PeakScope scope;
  at::Tensor latents = sample::denoise(model, sample::FlowMatchSchedulerConfig::flux_dev(), prompt, nullptr, settings,
                                       [&](int64_t, int64_t) {
                                         const auto now = Clock::now();
                                         steps.push_back(std::chrono::duration<double>(now - last).count());
                                         last = now;
                                         const double cpu = cpu_seconds();
                                         cpu_steps.push_back(cpu - last_cpu);
                                         last_cpu = cpu;
                                       });
  return {median(steps), median(cpu_steps), scope.peak_delta(), seconds_since(start), latents};
}

void part_small() {
  std::printf("== flux-small (random weights, fp32, 1 thread), 512 text tokens, 8 steps, flux-dev scheduler\n");
  torch::manual_seed(0);
  const auto config = models::FluxConfig::preset("flux-small");
  models::Flux model(config);
  model->eval();
  std::printf("weights %s\n", mib(parameter_bytes(*model)).c_str());
  std::printf("%10s %13s %14s %14s %18s\n", "pixels", "image tokens", "s/step wall", "s/step CPU", "peak above weights");
  const auto prompt = random_prompt(config, 512);
  for (const int64_t side : {256, 512, 1024}) {
    sample::SamplingSettings settings;
    settings.width = settings.height = side;
    settings.num_inference_steps = 8;
    settings.guidance_scale = 3.5;
    const auto f = time_denoise(*model, prompt, settings);
    std::printf("%10lld %13lld %14.4f %14.4f %18s\n", static_cast<long long>(side),
                static_cast<long long>((side / 16) * (side / 16)), f.step_seconds, f.step_cpu_seconds,
                mib(f.peak_bytes).c_str());
  }
}

void part_dev(int64_t pixels, int64_t repeats) {
  const auto config = models::FluxConfig::preset("flux-dev");
  const int64_t n_img = (pixels / 16) * (pixels / 16), n_txt = 512, D = config.hidden_size();
  std::printf("== FLUX.1-dev shape: one block at %lldx%lld pixels (%lld image + %lld text tokens), 1 thread, "
              "median of %lld\n",
              static_cast<long long>(pixels), static_cast<long long>(pixels), static_cast<long long>(n_img),
              static_cast<long long>(n_txt), static_cast<long long>(repeats));
  std::printf("whole model: %.2f GB of weights in bf16, %.2f GB in fp32 (this machine: 25.3 GB of RAM): not loaded\n",
              static_cast<double>(models::parameter_count(config)) * 2 / 1e9,
              static_cast<double>(models::parameter_count(config)) * 4 / 1e9);
  const auto rope = models::flux_rope_tables(
      at::cat({models::flux_text_ids(n_txt), models::flux_image_ids(pixels / 16, pixels / 16)}, 0),
      config.axes_dims_rope);
  std::printf("%6s %8s %12s %12s %12s %18s\n", "dtype", "block", "weights", "s wall", "s CPU", "peak above weights");
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    torch::NoGradGuard no_grad;
    torch::manual_seed(0);
    const auto opts = at::TensorOptions().dtype(dtype);
    double step_estimate = 0;
    int64_t block_peak = 0;
    {
      models::FluxTransformerBlock block(D, config.num_attention_heads);
      block->to(dtype);
      const at::Tensor x = torch::randn({1, n_img, D}, opts), c = torch::randn({1, n_txt, D}, opts),
                       temb = torch::randn({1, D}, opts);
      std::vector<double> times, cpu_times;
      int64_t peak = 0;
      for (int64_t r = 0; r < repeats; ++r) {
        memory::PeakScope scope;
        const auto start = Clock::now();
        const double cpu = cpu_seconds();
        block->forward(x, c, temb, rope);
        times.push_back(seconds_since(start));
        cpu_times.push_back(cpu_seconds() - cpu);
        peak = std::max(peak, scope.peak_delta());
      }
      std::printf("%6s %8s %12s %12.2f %12.2f %18s\n", dtype == at::kFloat ? "fp32" : "bf16", "double",
                  mib(parameter_bytes(*block)).c_str(), median(times), median(cpu_times), mib(peak).c_str());
      step_estimate += static_cast<double>(config.num_layers) * median(cpu_times);
      block_peak = std::max(block_peak, peak);
    }
    {
      models::FluxSingleTransformerBlock block(D, config.num_attention_heads);
      block->to(dtype);
      const at::Tensor s = torch::randn({1, n_txt + n_img, D}, opts), temb = torch::randn({1, D}, opts);
      std::vector<double> times, cpu_times;
      int64_t peak = 0;
      for (int64_t r = 0; r < repeats; ++r) {
        memory::PeakScope scope;
        const auto start = Clock::now();
        const double cpu = cpu_seconds();
        block->forward(s, temb, rope);
        times.push_back(seconds_since(start));
        cpu_times.push_back(cpu_seconds() - cpu);
        peak = std::max(peak, scope.peak_delta());
      }
      std::printf("%6s %8s %12s %12.2f %12.2f %18s\n", dtype == at::kFloat ? "fp32" : "bf16", "single",
                  mib(parameter_bytes(*block)).c_str(), median(times), median(cpu_times), mib(peak).c_str());
      step_estimate += static_cast<double>(config.num_single_layers) * median(cpu_times);
      block_peak = std::max(block_peak, peak);
    }
    std::printf("EXTRAPOLATED %s full step (19 double + 38 single blocks, embedders not counted, CPU seconds): %.0f s; "
                "28 steps: %.1f min; peak = weights + %s\n",
                dtype == at::kFloat ? "fp32" : "bf16", step_estimate, step_estimate * 28 / 60, mib(block_peak).c_str());
  }
}

void part_share() {
  std::printf("== demo: training step vs one validation image (flux-small, 1 thread)\n");
  torch::manual_seed(0);
  train::TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = "flux-small";
  auto model = train::make_transformer(spec, at::Device(at::kCPU));
  model->apply_lora("all", 16, 16.0);
  model->set_checkpoint_plan(CheckpointPlan::simpletuner(true, 2, std::nullopt, "torch"));
  std::vector<at::Tensor> params;
  for (auto& [name, p] : model->trainable_parameters()) params.push_back(p);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  at::Generator generator = at::detail::createCPUGenerator(1);
  // The demo's batch: 4 pictures of 32 x 32 pixels = 16 x 16 demo-VAE latents = 64 image tokens;
  // 32 text tokens (tokenizer_max_length).
  const train::Batch batch = model->synthetic_batch(4, 64, 32, generator, at::Device(at::kCPU));
  train::FlowMatchingOptions flow;
  std::vector<double> train_steps, train_cpu;
  for (int i = 0; i < 12; ++i) {
    model->module().train();
    const auto start = Clock::now();
    const double cpu = cpu_seconds();
    optimizer.zero_grad();
    model->flow_matching_loss(batch, flow, generator).backward();
    optimizer.step();
    if (i >= 2) {
      train_steps.push_back(seconds_since(start));
      train_cpu.push_back(cpu_seconds() - cpu);
    }
  }
  const double step = median(train_cpu);

  // One validation image: 30 steps (validation_num_inference_steps' default) at the demo's
  // 32-pixel size (16 x 16 latents through the demo VAE's factor 2), then the demo VAE decodes.
  auto& flux = dynamic_cast<models::FluxImpl&>(model->module());
  model->module().eval();
  auto vae_config = encoders::demo_vae_config(flux.config());
  encoders::AutoencoderKL vae(vae_config);
  vae->eval();
  const auto prompt = random_prompt(flux.config(), 32);
  sample::SamplingSettings settings;
  settings.vae_scale_factor = int64_t{1} << (vae_config.block_out_channels.size() - 1);
  settings.width = settings.height = 16 * settings.vae_scale_factor;
  settings.num_inference_steps = 30;
  settings.guidance_scale = 1.0;
  std::vector<double> images, images_wall, loops;
  int64_t peak = 0;
  for (int i = 0; i < 5; ++i) {
    settings.seed = static_cast<uint64_t>(i);
    memory::PeakScope scope;
    const auto start = Clock::now();
    const double cpu = cpu_seconds();
    const auto f = time_denoise(flux, prompt, settings);
    torch::NoGradGuard no_grad;
    const at::Tensor pixels = sample::to_uint8_image(vae->decode(vae->from_transformer_latents(f.latents.unsqueeze(0))));
    images_wall.push_back(seconds_since(start));  // the loop and the decode
    images.push_back(cpu_seconds() - cpu);
    loops.push_back(f.step_cpu_seconds * 30);
    peak = std::max(peak, scope.peak_delta());
  }
  const double image = median(images);
  std::printf("training step (batch 4, LoRA rank 16, checkpointing interval 2, AdamW): %.4f s CPU, %.4f s wall "
              "(median of 10)\n", step, median(train_steps));
  std::printf("one validation image (30 steps + decode): %.4f s CPU, %.4f s wall (median of 5; 30 x the median "
              "step alone %.4f s CPU); peak above the model %s\n",
              image, median(images_wall), median(loops), mib(peak).c_str());
  std::printf("sampling's share of the run's CPU time:\n");
  std::printf("%16s %22s %22s\n", "validate every", "1 image (prompt only)", "2 images (+unconditional)");
  for (const int64_t n : {10, 20, 50, 100}) {
    const auto share = [&](double images_per_validation) {
      const double v = images_per_validation * image;
      return 100.0 * v / (static_cast<double>(n) * step + v);
    };
    std::printf("%10lld steps %21.1f%% %21.1f%%\n", static_cast<long long>(n), share(1), share(2));
  }
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_cpu_tracking();
  torch::set_num_threads(1);  // see docs/PERFORMANCE.md, "Threads"
  const std::string part = argc > 1 ? argv[1] : "all";
  const int64_t dev_pixels = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int64_t dev_repeats = argc > 3 ? std::atoll(argv[3]) : 1;
  TORCH_CHECK_VALUE(part == "small" || part == "dev" || part == "share" || part == "all",
                    "part must be small, dev, share or all, got ", part);
  TORCH_CHECK_VALUE(dev_pixels >= 16 && dev_pixels % 16 == 0, "dev_pixels must be a positive multiple of 16, got ",
                    dev_pixels);
  TORCH_CHECK_VALUE(dev_repeats >= 1, "dev_repeats must be >= 1, got ", dev_repeats);
  if (part == "small" || part == "all") part_small();
  if (part == "share" || part == "all") part_share();
  if (part == "dev" || part == "all") part_dev(dev_pixels, dev_repeats);
  return 0;
}
