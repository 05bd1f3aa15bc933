// `remat init`: writes randomly initialised transformer weights under the diffusers key names.
#include <iostream>

#include <torch/torch.h>

#include "command.h"
#include "model_options.h"
#include "remat/io/safetensors.h"
#include "remat/train/memory/admission.h"
#include "remat/train/run/startup_checks.h"

namespace remat::cli {
namespace {

int run_init(const std::vector<std::string>& args) {
  CLI::App app{"Write randomly initialised weights (diffusers key names) to a .safetensors file.",
               "remat init"};
  ModelFlags model;
  model.add_to(app);
  int64_t seed = 0;
  std::string output;
  bool skip_memory_check = false;
  add_registry_option(app, "seed", seed);
  app.add_option("--output", output, "Output .safetensors file")->required();
  add_skip_memory_check(app, skip_memory_check);
  if (auto code = parse_or_exit(app, args)) return *code;

  train::check_output_file(output, "--output");
  const auto spec = model.spec();
  if (!skip_memory_check) train::admit_model(spec, train::ModelUse{}, at::Device(at::kCPU));
  torch::manual_seed(static_cast<uint64_t>(seed));
  auto transformer = train::make_transformer(spec, at::Device(at::kCPU));
  io::save_module(output, transformer->module());
  int64_t count = 0;
  for (const auto& p : transformer->module().parameters()) count += p.numel();
  std::cout << "wrote " << output << ": " << transformer->module().named_parameters().size()
            << " tensors, " << count << " parameters\n";
  return 0;
}

REMAT_COMMAND("init", "write randomly initialised weights (diffusers key names)", run_init);

}  // namespace
}  // namespace remat::cli
