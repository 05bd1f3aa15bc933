// `remat make-demo-pipeline`: writes a tiny diffusers Flux or MageFlow pipeline folder (random
// weights) to try `remat encode`, `remat train --pretrained_model_name_or_path <folder>` and
// `remat sample` without the published model.
#include <iostream>

#include "command.h"
#include "parse_args.h"
#include "remat/encoders/demo_pipeline.h"
#include "remat/train/family/family.h"
#include "remat/util/error.h"

namespace remat::cli {
namespace {

int run_make_demo_pipeline(const std::vector<std::string>& args) {
  CLI::App app{"Write a tiny diffusers pipeline folder with random weights. flux: model_index.json, a sharded "
               "transformer, VAE, CLIP and T5 text encoders, their tokenizers (a small CLIP vocabulary, a trained "
               "SentencePiece model) and the scheduler config. mageflow: the transformer, Mage-VAE, Qwen3-VL's "
               "language model with a small Qwen2 tokenizer.json, and the scheduler config.",
               "remat make-demo-pipeline"};
  std::string output, family_name = train::model_family_names().front();
  encoders::DemoPipelineOptions options;
  options.transformer_preset.clear();
  int64_t seed = 0;
  std::vector<std::string> families;
  for (const auto* family : train::model_families()) {
    if (family->write_demo_pipeline) families.push_back(family->name);
  }
  app.add_option("--output", output, "Directory to create (must not hold a model_index.json yet)")->required();
  app.add_option("--model_family", family_name, "The pipeline's model family")
      ->check(CLI::IsMember(families))
      ->capture_default_str();
  add_registry_option(app, "seed", seed);
  app.add_option("--transformer_preset", options.transformer_preset,
                 "The transformer's architecture, a preset of the family (default: its small test one, flux-tiny "
                 "or mageflow-tiny)");
  app.add_option("--dtype", options.dtype, "Weight dtype of the files")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  app.add_option("--transformer_shards", options.transformer_shards,
                 "About how many shards the transformer's weights are cut into (1: one file, no index)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}))
      ->capture_default_str();
  if (auto code = parse_or_exit(app, args)) return *code;
  options.seed = static_cast<uint64_t>(seed);
  const train::ModelFamily& family = train::model_family(family_name);
  // A preset or a flavour of the family (preset_of names the valid ones otherwise).
  options.transformer_preset = family.preset_of(options.transformer_preset.empty() ? family.small_flavour
                                                                                   : options.transformer_preset);
  const auto written = family.write_demo_pipeline(output, options);
  std::cout << "wrote a " << family.display_name << " pipeline folder to " << output << " (";
  for (size_t i = 0; i < written.size(); ++i) std::cout << (i ? ", " : "") << written[i];
  std::cout << ")\n";
  return 0;
}

REMAT_COMMAND("make-demo-pipeline", "write a tiny diffusers Flux or MageFlow pipeline folder", run_make_demo_pipeline);

}  // namespace
}  // namespace remat::cli
