// `remat forward`: the reference forward pass in float32 on named input tensors; writes `sample`.
#include <iostream>

#include <torch/torch.h>

#include "command.h"
#include "model_options.h"
#include "remat/util/files.h"
#include "remat/io/safetensors.h"
#include "remat/train/memory/admission.h"
#include "remat/train/run/startup_checks.h"

namespace remat::cli {
namespace {

int run_forward(const std::vector<std::string>& args) {
  CLI::App app{"Run the forward pass on inputs named as the reference's arguments and "
               "write the result as `sample`.",
               "remat forward"};
  ModelFlags model;
  model.add_to(app);
  std::string weights, inputs_path, output;
  app.add_option("--weights", weights, "Transformer weights (.safetensors, diffusers or Black Forest Labs key names; docs/WEIGHT_FORMATS.md)")->required();
  app.add_option("--inputs", inputs_path,
                 "Input tensors (.safetensors). Flux: hidden_states, encoder_hidden_states, "
                 "pooled_projections, timestep, img_ids, txt_ids, guidance (dev)")->required();
  app.add_option("--output", output, "Output .safetensors file (key `sample`)")->required();
  std::string dtype = "float32";
  app.add_option("--dtype", dtype, "Model dtype: float32, or bfloat16 (weights cast after loading; "
                                   "image and text inputs cast to it)")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  bool skip_memory_check = false;
  add_skip_memory_check(app, skip_memory_check);
  if (auto code = parse_or_exit(app, args)) return *code;

  // Every path is checked before the model is built: a FIFO would block, and an unwritable
  // output would fail only after the forward pass.
  util::require_regular_file(weights, "forward", "--weights");
  util::require_regular_file(inputs_path, "forward", "--inputs");
  train::check_output_file(output, "--output");
  auto spec = model.spec();
  spec.weights = weights;
  if (!skip_memory_check) train::admit_model(spec, train::ModelUse{}, at::Device(at::kCPU));
  auto transformer = train::make_transformer(spec, at::Device(at::kCPU));
  if (dtype == "bfloat16") transformer->module().to(at::kBFloat16);
  transformer->module().eval();

  const auto file = io::SafetensorsFile::open(inputs_path);
  std::map<std::string, at::Tensor> inputs;
  for (const auto& name : file.names()) inputs[name] = file.tensor(name);
  at::Tensor sample;
  {
    torch::NoGradGuard no_grad;
    sample = transformer->forward_named(inputs).to(at::kFloat).contiguous();
  }
  io::save_safetensors(output, {{"sample", sample}});
  std::cout << "wrote " << output << ": sample " << sample.sizes() << "\n";
  return 0;
}

REMAT_COMMAND("forward", "run the forward pass on named inputs, write `sample`", run_forward);

}  // namespace
}  // namespace remat::cli
