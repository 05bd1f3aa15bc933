// `remat demo-quality`: the quality check of the whole loop on the demo. Samples every caption of
// `make demo`'s pictures from the base transformer and with the trained LoRA, and prints how often
// a nearest-centroid classifier on the cached training latents names the prompt's colour,
// background and shape, beside chance (remat/train/demo_quality.h, docs/SAMPLING.md).
#include <iostream>

#include "command.h"
#include "parse_args.h"
#include "remat/train/config.h"
#include "remat/train/demo_quality.h"

namespace remat::cli {
namespace {

int run_demo_quality(const std::vector<std::string>& args) {
  CLI::App app{"Score what a LoRA trained by `make demo` samples: every caption's colour, background and shape, "
               "classified in the latent space (the demo VAE has random weights) by nearest centroid over the "
               "cached training latents, for the base model and with the trained LoRA, beside chance.",
               "remat demo-quality"};
  std::string config_path = "configs/demo-flux-lora.json";
  train::DemoQualityOptions options;
  app.add_option("--config", config_path, "The training run's config (its caches, pipeline and output_dir)")
      ->capture_default_str();
  app.add_option("--lora", options.lora_path,
                 "The trained LoRA (any form remat sample reads); default: output_dir/pytorch_lora_weights.safetensors");
  app.add_option("--seeds", options.seeds_per_caption, "Samples per caption and model (seeds 0 .. n-1)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}))
      ->capture_default_str();
  app.add_option("--num_inference_steps", options.num_inference_steps, "Denoising steps per sample")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}))
      ->capture_default_str();
  app.add_option("--guidance_scale", options.guidance_scale,
                 "Embedded guidance (the demo trains with flux_guidance_value 1.0)")
      ->capture_default_str();
  app.add_option("--latent_size", options.latent_size,
                 "Latent side of the samples (0: the training latents' square bucket)")
      ->check(CLI::Range(int64_t{0}, int64_t{256}))
      ->capture_default_str();
  if (auto code = parse_or_exit(app, args)) return *code;

  std::vector<std::string> warnings;
  const train::TrainConfig config = train::load_train_config({"--config=" + config_path}, warnings);  // throws: exit 2
  for (const auto& warning : warnings) std::cerr << "warning: " << warning << "\n";
  const auto report =
      train::measure_demo_quality(config, options, [](const std::string& line) { std::cerr << line << "\n"; });
  std::cout << train::format_demo_quality(report);
  std::cout << "sampling: " << options.num_inference_steps << " steps, guidance " << options.guidance_scale
            << ", seeds 0-" << options.seeds_per_caption - 1 << "\n";
  return 0;
}

REMAT_COMMAND("demo-quality", "score a LoRA trained by `make demo`: sampled colour, background, shape vs chance",
              run_demo_quality);

}  // namespace
}  // namespace remat::cli
