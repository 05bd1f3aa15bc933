// `remat demo-quality`: the quality check of the whole loop on the demo. Samples every caption of
// `make demo`'s pictures from the base transformer and with the trained LoRA, and prints how often
// a nearest-centroid classifier on the cached training latents names the prompt's colour,
// background and shape, beside chance (remat/train/validation/demo_quality.h, docs/SAMPLING.md).
#include <iostream>

#include "command.h"
#include "parse_args.h"
#include "remat/train/family/hub_models.h"
#include "remat/train/options/options.h"
#include "remat/train/options/config.h"
#include "remat/train/validation/demo_quality.h"

namespace remat::cli {
namespace {

constexpr const char* kDemoConfig = "configs/demo-flux-lora.json";

int run_demo_quality(const std::vector<std::string>& args) {
  CLI::App app{"Score what a LoRA trained by `make demo` samples: every caption's colour, background and shape, "
               "classified in the latent space (the demo VAE has random weights) by nearest centroid over the "
               "cached training latents, for the base model and with the trained LoRA, beside chance.",
               "remat demo-quality"};
  train::DemoQualityOptions options;
  // Every other argument is the training run's, exactly as given to `remat train` (--config FILE and
  // --key=value overrides such as --output_dir): the check reads that run's caches, pipeline and
  // output. Without --config, make demo's configs/demo-flux-lora.json.
  app.allow_extras();
  app.footer("Other arguments: the training run's options as given to remat train (default: --config " +
             std::string(kDemoConfig) + ").");
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
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 consumes from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  std::vector<std::string> train_args = app.remaining();
  bool has_config = false;
  for (const auto& arg : train_args) has_config = has_config || arg == "--config" || arg.rfind("--config=", 0) == 0;
  if (!has_config) train_args.insert(train_args.begin(), std::string("--config=") + kDemoConfig);

  std::vector<std::string> warnings;
  train::TrainConfig config = train::load_train_config(train_args, warnings);  // throws: exit 2
  for (const auto& warning : warnings) std::cerr << "warning: " << warning << "\n";
  for (const auto& line : train::resolve_hub_models(config)) std::cerr << line << "\n";  // throws: exit 2
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
