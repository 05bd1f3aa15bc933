// `remat cache`: the caching phase of an image run alone. It reads the same options as
// `remat train` (--config FILE and flags), scans the datasets, brings the VAE-latent and
// text-embedding caches up to date and prints what it did; nothing is trained.
#include <iostream>

#include "command.h"
#include "remat/util/error.h"
#include "remat/memory.h"
#include "remat/train/family/hub_models.h"
#include "remat/train/options/config.h"
#include "remat/train/data/image_data.h"
#include "remat/train/options/options.h"
#include "remat/train/run/progress.h"

namespace remat::cli {
namespace {

int run_cache(const std::vector<std::string>& args) {
  if (train::parse_command_line(args).help) {
    std::cout << "usage: remat cache --config FILE [--option=value ...]\n"
                 "Runs only the caching phase of `remat train` with the same options: the datasets of\n"
                 "data_backend_config or instance_data_dir are scanned, and every missing or stale VAE latent\n"
                 "and caption embedding is computed with the encoders of pretrained_model_name_or_path (a\n"
                 "diffusers pipeline folder). Up-to-date entries are reused. See `remat train --help`.\n";
    return 0;
  }
  std::vector<std::string> warnings;
  train::TrainConfig config = train::load_train_config(args, warnings);  // throws: exit 2
  for (const auto& warning : warnings) std::cerr << "warning: " << warning << "\n";
  for (const auto& line : train::resolve_hub_models(config)) std::cerr << line << "\n";  // throws: exit 2
  if (!train::is_image_run(config)) {
    throw_value_error("[cache] nothing to cache: set data_backend_config, or instance_data_dir to a folder of "
                      "pictures with captions (a directory of .safetensors samples is already a latent cache)");
  }
  const auto log = [](const std::string& line) { std::cerr << line << "\n"; };
  const auto scanned = train::scan_image_data(config, log);
  train::image_pipeline_folder(config);
  const auto report = train::cache_image_data(config, scanned, log,
                                              train::ProgressReporter::stream_is_terminal(stderr));
  for (const auto& line : train::describe_cache_report(report)) std::cout << line << "\n";
  int64_t samples = 0;
  for (const auto& dataset : report.samples) samples += static_cast<int64_t>(dataset.size());
  std::cout << "[cache] " << samples << " sample(s) ready in " << scanned.datasets.size() << " dataset(s)\n";
  return 0;
}

REMAT_COMMAND("cache", "compute the VAE-latent and text-embedding caches of an image run (no training)", run_cache);

}  // namespace
}  // namespace remat::cli
