// `remat bench`: training-step time and peak memory per checkpoint layout, with predictions.
#include <algorithm>
#include <iostream>
#include <sstream>

#include "benchmark_report.h"
#include "command.h"
#include "model_options.h"
#include "remat/util/files.h"
#include "remat/train/memory/benchmark.h"
#include "remat/train/run/startup_checks.h"

namespace remat::cli {
namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int run_bench(const std::vector<std::string>& args) {
  CLI::App app{"Training-step time and peak memory per gradient-checkpointing layout (forward, "
               "flow-matching loss, backward, AdamW step), each with the step model's prediction.",
               "remat bench"};
  ModelFlags model;
  model.add_to(app);
  train::BenchmarkOptions o;
  std::string resolution, layouts, json, csv, svg, precisions = "no_change";
  // Every count is bounded (a flag of 10^12 tokens would size tensors before anything failed):
  // 2^20 image tokens is a 16384 x 16384 Flux image; the others as make-demo-data bounds them.
  constexpr int64_t kMaxTokens = int64_t{1} << 20;
  auto* tokens_opt = app.add_option("--image_tokens", o.image_tokens, "Packed image tokens N_i")
                         ->check(CLI::Range(int64_t{1}, kMaxTokens))->capture_default_str();
  app.add_option("--resolution", resolution, "Image size WxH instead of --image_tokens (Flux: N_i = (W/16)(H/16))")
      ->excludes(tokens_opt);
  app.add_option("--text_tokens", o.text_tokens, "Text tokens N_t")->check(CLI::Range(int64_t{1}, int64_t{65536}))->capture_default_str();
  app.add_option("--batch", o.batch, "Batch size B")->check(CLI::Range(int64_t{1}, int64_t{65536}))->capture_default_str();
  app.add_option("--dtype", o.dtype, "float32, or bfloat16 (bf16 weights + bf16 autocast)")
      ->check(CLI::IsMember({"float32", "bfloat16"}))->capture_default_str();
  app.add_option("--device", o.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app.add_option("--lora_rank", o.lora_rank, "LoRA rank; 0 = full fine-tune")->check(CLI::Range(int64_t{0}, int64_t{4096}))->capture_default_str();
  app.add_option("--lora_target", o.lora_target, "LoRA target preset of the family (Flux: flux_lora_target's values)")->capture_default_str();
  app.add_option("--base_model_precision", precisions,
                 "Comma list of base_model_precision values (SimpleTuner's names: no_change, int8-quanto, "
                 "nf4-bnb, ...), each benchmarked over the same layouts and shown side by side; a "
                 "quantised one needs --lora_rank > 0")
      ->capture_default_str();
  add_registry_option(app, "torch_num_threads", o.threads);
  app.add_option("--layouts", layouts,
                 "Comma list: off, N (interval), N/S (interval/stride), ffn, offload, auto:SIZE "
                 "(e.g. auto:20GiB). Default: off,1,2,4,8,2/4,ffn,offload (CUDA only) and two auto "
                 "budgets between the smallest possible and the keep-all predicted peak");
  app.add_option("--steps", o.steps, "Measured steps per layout")->check(CLI::Range(int64_t{1}, int64_t{1000000}))->capture_default_str();
  app.add_option("--warmup", o.warmup, "Warm-up rounds (one step per layout each)")->check(CLI::Range(int64_t{0}, int64_t{1000000}))->capture_default_str();
  add_registry_option(app, "seed", o.seed);
  app.add_option("--world_size", o.world_size,
                 "Also predict the memory per process of data-parallel training on this many "
                 "processes, with and without ZeRO-1 (deepspeed_config zero1; full fine-tune)")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}))->capture_default_str();
  app.add_option("--json", json, "Write the records as JSON here");
  app.add_option("--csv", csv, "Write the records as CSV here");
  app.add_option("--svg", svg, "Write a peak-memory vs step-time chart (SVG) here");
  add_skip_memory_check(app, o.skip_memory_check);
  if (auto code = parse_or_exit(app, args)) return *code;

  // The report files are written after the whole run: check that they can be, before it.
  for (const auto& [flag, path] : {std::pair<const char*, const std::string*>{"--json", &json}, {"--csv", &csv}, {"--svg", &svg}}) {
    if (!path->empty()) train::check_output_file(*path, flag);
  }

  if (!resolution.empty()) {
    int64_t w = 0, h = 0;
    char x = 0;
    std::istringstream in(resolution);
    if (!(in >> w >> x >> h) || x != 'x' || w < 16 || h < 16 || w % 16 != 0 || h % 16 != 0 || !in.eof() ||
        w > 16384 || h > 16384) {
      std::cerr << "error: --resolution must be WxH with W and H multiples of 16 in [16, 16384], got '"
                << resolution << "'\n";
      return 2;
    }
    o.image_tokens = (w / 16) * (h / 16);
  }
  o.model = model.spec();
  o.layouts = split_commas(layouts);
  // Bad options and files throw; main() prints them and exits with code 2.
  // One benchmark per precision, each over the same layouts; one table. The facts are the first
  // run's, with every precision named.
  const std::vector<std::string> precision_list = split_commas(precisions);
  if (precision_list.empty()) {
    std::cerr << "error: --base_model_precision must name at least one precision, got '" << precisions << "'\n";
    return 2;
  }
  train::BenchmarkReport report;
  for (const auto& precision : precision_list) {
    o.base_model_precision = precision;
    const auto one = train::run_benchmark(o, [](const std::string& line) { std::cerr << line << "\n"; });
    if (report.records.empty()) {
      report = one;
      continue;
    }
    report.records.insert(report.records.end(), one.records.begin(), one.records.end());
    report.worst_peak_error_pct = std::max(report.worst_peak_error_pct, one.worst_peak_error_pct);
  }
  if (precision_list.size() > 1) {
    for (auto& [key, value] : report.facts) {
      if (key == "base_model_precision") value = precisions + " (one run each, same layouts)";
    }
  }
  std::cout << format_benchmark_table(report);
  if (!json.empty()) util::write_file_atomically(json, benchmark_json(report), "bench");
  if (!csv.empty()) util::write_file_atomically(csv, benchmark_csv(report), "bench");
  if (!svg.empty()) util::write_file_atomically(svg, benchmark_svg(report), "bench");
  return 0;
}

REMAT_COMMAND("bench", "time and peak memory of training steps per checkpoint layout", run_bench);

}  // namespace
}  // namespace remat::cli
