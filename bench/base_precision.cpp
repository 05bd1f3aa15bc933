// base_model_precision side by side (docs/QUANTISATION.md):
//  1. the transformer's weight bytes from the memory model (remat/train/memory/admission.h) for flux-dev
//     and flux-small in bf16, int8 (int8-quanto) and NF4 (nf4-bnb), and the bytes measured by the
//     tracking allocator when flux-small is built at each precision (float32, as training builds);
//  2. the demo (configs/demo-flux-lora.json, what `remat train --config` runs) trained at
//     no_change, int8-quanto and nf4-bnb: final loss, median step time, step peak and the run's
//     tracked peak, one row each.
// Usage: base_precision [--config configs/demo-flux-lora.json] [--steps N] [--output out/quant-demo]
// The demo's pipeline and images must exist (`make demo` makes them under out/).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "remat/memory.h"
#include "remat/models/quantization.h"
#include "remat/train/memory/admission.h"
#include "remat/train/options/config.h"
#include "remat/train/run/trainer.h"
#include "remat/train/family/transformer.h"

namespace {

using namespace remat;

const std::vector<std::string> kPrecisions = {"no_change", "int8-quanto", "nf4-bnb"};

train::TransformerSpec flux(const std::string& flavour, const std::string& precision) {
  train::TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = flavour;
  spec.base_precision = models::parse_base_model_precision(precision);
  return spec;
}

void weight_table() {
  std::printf("Transformer weight bytes from the memory model (quantised Linears at data + scales, the\n"
              "rest in the dtype; 'transient' = the largest Linear while it is dequantised):\n\n");
  std::printf("%-11s | %-11s | %-5s | %12s | %16s | %10s | %12s\n", "model", "precision", "dtype", "weights",
              "quantised part", "Linears q.", "transient");
  for (const char* flavour : {"flux-dev", "flux-small"}) {
    for (const auto& precision : kPrecisions) {
      train::ModelUse use;
      use.weight_element_bytes = 2;  // bf16, as published and as a GPU run keeps them
      use.base_precision = models::parse_base_model_precision(precision);
      const auto d = train::predict_model_memory(flux(flavour, "no_change"), use);
      std::printf("%-11s | %-11s | %-5s | %12s | %16s | %10lld | %12s\n", flavour, precision.c_str(), "bf16",
                  memory::format_bytes(d->weight_bytes).c_str(), memory::format_bytes(d->quantized_weight_bytes).c_str(),
                  static_cast<long long>(d->quantized_linears), memory::format_bytes(d->dequantized_transient_bytes).c_str());
    }
  }
  std::printf("\nflux-small built at each precision (float32 rest), tracked bytes after the build vs the model:\n\n");
  std::printf("%-11s | %14s | %14s | %14s\n", "precision", "measured", "predicted", "build peak");
  for (const auto& precision : kPrecisions) {
    train::ModelUse use;
    use.base_precision = models::parse_base_model_precision(precision);
    const int64_t predicted = train::predict_model_memory(flux("flux-small", "no_change"), use)->weight_bytes;
    const int64_t before = memory::current_bytes();
    memory::reset_peak();
    int64_t measured = 0, peak = 0;
    {
      torch::manual_seed(0);
      auto model = train::make_transformer(flux("flux-small", precision), at::Device(at::kCPU));
      measured = memory::current_bytes() - before;
      peak = memory::peak_bytes() - before;
    }
    std::printf("%-11s | %10.1f MiB | %10.1f MiB | %10.1f MiB\n", precision.c_str(), measured / 1048576.0,
                predicted / 1048576.0, peak / 1048576.0);
  }
}

void demo(const std::string& config_path, int64_t steps, const std::string& output) {
  std::printf("\nThe demo (%s) for %lld steps at each precision (torch_num_threads from the config):\n\n",
              config_path.c_str(), static_cast<long long>(steps));
  struct Row {
    std::string precision;
    train::RunSummary summary;
    int64_t run_peak = 0;
  };
  std::vector<Row> rows;
  for (const auto& precision : kPrecisions) {
    std::vector<std::string> warnings;
    const train::TrainConfig config = train::load_train_config(
        {"--config=" + config_path, "--base_model_precision=" + precision, "--output_dir=" + output + "/" + precision,
         "--max_train_steps=" + std::to_string(steps), "--resume_from_checkpoint=none", "--checkpoint_step_interval=0",
         "--validation_disable=true"},
        warnings);
    train::TrainerHooks hooks;
    hooks.log = [&precision](const std::string& line) { std::fprintf(stderr, "[%s] %s\n", precision.c_str(), line.c_str()); };
    memory::reset_peak();
    const int64_t before = memory::current_bytes();
    const train::TrainResult result = train::run_training(config, hooks);
    rows.push_back({precision, result.summary, memory::peak_bytes() - before});
  }
  std::printf("%-11s | %10s | %10s | %12s | %12s | %12s\n", "precision", "first loss", "final loss",
              "median step", "step peak", "run peak");
  for (const auto& r : rows) {
    std::printf("%-11s | %10.4f | %10.4f | %9.3f s  | %8.1f MiB | %8.1f MiB\n", r.precision.c_str(),
                r.summary.first_loss, r.summary.final_loss, r.summary.median_step_seconds,
                r.summary.peak_bytes / 1048576.0, r.run_peak / 1048576.0);
  }
  std::printf("\nfinal loss = mean of the last min(10, steps) losses; step peak = the largest per-step peak of the\n"
              "tracking allocator; run peak = tracked peak over the whole run (caches already built).\n");
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_cpu_tracking();
  std::string config = "configs/demo-flux-lora.json", output = "out/quant-demo";
  int64_t steps = 100;
  bool demo_run = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) config = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::atoll(argv[++i]);
    else if (a == "--output" && i + 1 < argc) output = argv[++i];
    else if (a == "--table_only") demo_run = false;
    else {
      std::fprintf(stderr, "usage: base_precision [--config FILE] [--steps N] [--output DIR] [--table_only]\n");
      return 2;
    }
  }
  try {
    weight_table();
    if (demo_run) demo(config, steps, output);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
