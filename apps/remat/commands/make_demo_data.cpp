// `remat make-demo-data`: writes a small latent-cache dataset with real structure (each latent is
// a function of its caption embedding), so a short training run can learn the mapping.
#include <filesystem>
#include <iostream>

#include "command.h"
#include "parse_args.h"
#include "remat/train/data/data.h"
#include "remat/train/family/family.h"

namespace remat::cli {
namespace {

int run_make_demo_data(const std::vector<std::string>& args) {
  CLI::App app{"Write a small latent-cache dataset whose latents depend on their caption "
               "embeddings.",
               "remat make-demo-data"};
  std::string output, family = train::model_family_names().front();
  int64_t samples = 32, seed = 0, size = 16, text_tokens = 32, joint_dim = 64, pooled_dim = 32,
          captions = 8;
  app.add_option("--output", output, "Directory to create (must not hold samples yet)")->required();
  app.add_option("--model_family", family, "Model family")->check(CLI::IsMember(train::model_family_names()))->capture_default_str();
  app.add_option("--samples", samples, "Number of samples")->check(CLI::Range(int64_t{1}, int64_t{1000000}))->capture_default_str();
  add_registry_option(app, "seed", seed);
  app.add_option("--size", size, "Latent height and width (a multiple of the family's patch: Flux 2; 16 -> 64 packed Flux tokens)")->check(CLI::Range(int64_t{2}, int64_t{4096}))->capture_default_str();
  app.add_option("--text_tokens", text_tokens, "Text tokens per sample")->check(CLI::Range(int64_t{1}, int64_t{65536}))->capture_default_str();
  app.add_option("--joint_dim", joint_dim, "Width of prompt_embeds (the model's joint_attention_dim / context_in_dim)")->check(CLI::Range(int64_t{1}, int64_t{65536}))->capture_default_str();
  app.add_option("--pooled_dim", pooled_dim, "Width of pooled_prompt_embeds (Flux's pooled_projection_dim)")->check(CLI::Range(int64_t{1}, int64_t{65536}))->capture_default_str();
  app.add_option("--captions", captions, "Distinct captions (samples cycle through them; 0 = one per sample)")->check(CLI::Range(int64_t{0}, int64_t{1000000}))->capture_default_str();
  if (auto code = parse_or_exit(app, args)) return *code;

  train::DemoDatasetOptions options;
  options.sizes = {{size, size}};
  options.text_tokens = text_tokens;
  options.joint_attention_dim = joint_dim;
  options.pooled_projection_dim = pooled_dim;
  options.num_captions = captions;
  const auto dataset = train::make_demo_dataset(output, train::model_family(family).latents, samples,
                                                static_cast<uint64_t>(seed), options);
  std::cout << "wrote " << dataset.size() << " " << family << " samples to " << output << "\n";
  return 0;
}

REMAT_COMMAND("make-demo-data", "write a small structured latent-cache dataset", run_make_demo_data);

}  // namespace
}  // namespace remat::cli
