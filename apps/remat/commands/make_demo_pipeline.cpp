// `remat make-demo-pipeline`: writes a tiny diffusers Flux pipeline folder (random weights) to
// try `remat encode` and `remat train --pretrained_model_name_or_path <folder>` without the
// published model.
#include <iostream>

#include "command.h"
#include "parse_args.h"
#include "remat/encoders/demo_pipeline.h"
#include "remat/models/flux.h"

namespace remat::cli {
namespace {

int run_make_demo_pipeline(const std::vector<std::string>& args) {
  CLI::App app{"Write a tiny diffusers Flux pipeline folder: model_index.json, a sharded transformer, VAE, "
               "CLIP and T5 text encoders with random weights, their tokenizers (a small CLIP vocabulary, "
               "a trained SentencePiece model) and the scheduler config.",
               "remat make-demo-pipeline"};
  std::string output;
  encoders::DemoPipelineOptions options;
  int64_t seed = 0;
  app.add_option("--output", output, "Directory to create (must not hold a model_index.json yet)")->required();
  add_registry_option(app, "seed", seed);
  app.add_option("--transformer_preset", options.transformer_preset, "The transformer's architecture")
      ->check(CLI::IsMember(models::FluxConfig::preset_names()))
      ->capture_default_str();
  app.add_option("--dtype", options.dtype, "Weight dtype of the files")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  app.add_option("--transformer_shards", options.transformer_shards,
                 "About how many shards the transformer's weights are cut into (1: one file, no index)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}))
      ->capture_default_str();
  if (auto code = parse_or_exit(app, args)) return *code;
  options.seed = static_cast<uint64_t>(seed);
  const auto written = encoders::write_demo_pipeline(output, options);
  std::cout << "wrote a Flux pipeline folder to " << output << " (";
  for (size_t i = 0; i < written.size(); ++i) std::cout << (i ? ", " : "") << written[i];
  std::cout << ")\n";
  return 0;
}

REMAT_COMMAND("make-demo-pipeline", "write a tiny diffusers Flux pipeline folder", run_make_demo_pipeline);

}  // namespace
}  // namespace remat::cli
