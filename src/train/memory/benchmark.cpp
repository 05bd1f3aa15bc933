// `remat bench`: layouts run round-robin on one model, with the step model's predictions.
#include "remat/threads.h"
#include "remat/train/memory/benchmark.h"
#include "remat/util/error.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include "remat/byte_size.h"
#include "remat/memory.h"
#include "remat/train/memory/admission.h"
#include "remat/train/memory/auto_layout.h"
#include "remat/train/memory/base_precision.h"
#include "remat/train/options/config.h"
#include "remat/train/family/family.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/run/step.h"
#include "remat/train/optimizers/zero_optimizer.h"
#include "remat/stats.h"

namespace remat::train {
namespace {

bool all_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

[[noreturn]] void bad_layout(const std::string& name, const std::string& why) {
  throw_value_error("[bench] layout must be off, N, N/S, ffn, offload or auto:SIZE (e.g. "
                              "auto:20GiB), got '" + name + "'" + (why.empty() ? "" : ": " + why));
}

std::string format_size_for_name(int64_t bytes) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  if (bytes >= (int64_t{1} << 30)) {
    out << static_cast<double>(bytes) / (1 << 30) << "GiB";
  } else {
    out << static_cast<double>(bytes) / (1 << 20) << "MiB";
  }
  return out.str();
}

}  // namespace

BenchmarkLayout parse_benchmark_layout(const std::string& name, const std::vector<int64_t>& stack_sizes) {
  BenchmarkLayout out;
  out.name = name;
  if (name == "off") {
    out.kind = BenchmarkLayout::Kind::Off;
    return out;
  }
  if (name == "ffn") {
    out.kind = BenchmarkLayout::Kind::Ffn;
    return out;
  }
  if (name.rfind("auto:", 0) == 0) {
    out.kind = BenchmarkLayout::Kind::Auto;
    try {
      out.budget_bytes = parse_byte_size(name.substr(5), "the budget");
    } catch (const c10::ValueError& e) {
      bad_layout(name, e.what_without_backtrace());
    }
    if (out.budget_bytes <= 0) bad_layout(name, "the budget must be more than 0 bytes");
    return out;
  }
  out.kind = BenchmarkLayout::Kind::Chain;
  std::vector<Layout> stacks;
  if (name == "offload") {
    for (int64_t size : stack_sizes) stacks.push_back(layout_from_interval(size, 1, std::nullopt, Backend::Offload));
  } else {
    const auto slash = name.find('/');
    const std::string interval_text = name.substr(0, slash);
    const std::string stride_text = slash == std::string::npos ? "" : name.substr(slash + 1);
    if (!all_digits(interval_text) || (slash != std::string::npos && !all_digits(stride_text))) bad_layout(name, "");
    const int64_t interval = std::stoll(interval_text);
    std::optional<int64_t> stride;
    if (!stride_text.empty()) stride = std::stoll(stride_text);
    if (interval < 1 || (stride && *stride < interval)) {
      bad_layout(name, "the interval must be >= 1 and the stride >= the interval");
    }
    for (int64_t size : stack_sizes) {
      // SimpleTuner: interval 1 is per-block checkpointing and ignores the stride.
      stacks.push_back(size == 0 ? Layout{}
                                 : layout_from_interval(size, std::min(interval, size),
                                                        interval == 1 ? std::nullopt : stride));
    }
  }
  out.layout = join_stack_layouts(stacks);
  return out;
}

std::vector<std::string> default_benchmark_layouts(bool cuda, int64_t min_peak_bytes,
                                                   int64_t keep_all_peak_bytes) {
  std::vector<std::string> names = {"off", "1", "2", "4", "8", "2/4", "ffn"};
  if (cuda) names.push_back("offload");
  const int64_t span = std::max<int64_t>(0, keep_all_peak_bytes - min_peak_bytes);
  for (int i = 1; i <= 2; ++i) {
    // When every layout has the same peak (the optimizer step dominates) both budgets coincide.
    const std::string name = "auto:" + format_size_for_name(min_peak_bytes + span * i / 3);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

DataParallelPrediction predict_data_parallel_memory(const Chain& chain, const Layout& layout, int64_t weight_bytes,
                                                    const std::vector<at::Tensor>& parameters,
                                                    const OptimizerSettings& settings, int64_t world_size, bool zero) {
  TORCH_CHECK_VALUE(world_size >= 1 && world_size <= 65536, "[bench] world_size must be in [1, 65536], got ",
                    world_size);
  DataParallelPrediction d;
  d.world_size = world_size;
  d.weight_bytes = weight_bytes;
  for (const auto& p : parameters) d.gradient_bytes += static_cast<int64_t>(p.numel() * p.element_size());
  d.optimizer_bytes = optimizer_state_bytes(settings, parameters);
  // The reducer's gradients exist from the step's start (StepProfileOptions::gradients_persist).
  Chain plain = chain;
  for (auto& block : plain.blocks) {
    plain.fixed_bytes += block.parameter_grad_bytes;
    block.parameter_grad_bytes = 0;
  }
  d.plain_peak_bytes = predict(plain, layout).peak_bytes;
  if (!zero) return d;
  const int ranks = static_cast<int>(world_size);
  d.zero_optimizer_bytes = zero_state_bytes_per_rank(settings, parameters, ranks);
  d.zero_broadcast_bytes = zero_broadcast_buffer_bytes(parameters, ranks);
  // The optimizer state is alive all step: the shard replaces the whole at every point; the
  // broadcast buffer exists after the update, when the step's fixed peak (the update) is over.
  Chain sharded = plain;
  const int64_t less = d.optimizer_bytes - d.zero_optimizer_bytes;
  sharded.fixed_bytes -= less;
  sharded.fixed_peak_bytes -= less;
  const int64_t after_update = predict(sharded, layout).peak_bytes;
  d.zero_peak_bytes = std::max(after_update, sharded.fixed_bytes + d.zero_broadcast_bytes);
  return d;
}

BenchmarkReport run_benchmark(const BenchmarkOptions& options, const std::function<void(const std::string&)>& log_fn) {
  BenchmarkOptions o = options;
  if (o.model.flavour.empty() && !o.model.config_json) o.model.flavour = model_family(o.model.family).small_flavour;
  const auto log = [&](const std::string& line) {
    if (log_fn) log_fn(line);
  };
  TORCH_CHECK_VALUE(o.device == "cpu" || o.device == "cuda", "[bench] device must be cpu or cuda, got '",
                    o.device, "'");
  TORCH_CHECK_VALUE(o.dtype == "float32" || o.dtype == "bfloat16",
                    "[bench] dtype must be float32 or bfloat16, got '", o.dtype, "'");
  TORCH_CHECK_VALUE(o.steps >= 1, "[bench] steps must be >= 1, got ", o.steps);
  TORCH_CHECK_VALUE(o.warmup >= 0, "[bench] warmup must be >= 0, got ", o.warmup);
  TORCH_CHECK_VALUE(o.lora_rank >= 0, "[bench] lora_rank must be >= 0 (0 = full fine-tune), got ", o.lora_rank);
  TORCH_CHECK_VALUE(o.threads >= 0 && o.threads <= kMaxNumThreads, "[bench] threads must be in [0, ", kMaxNumThreads,
                    "] (0 = LibTorch's default), got ", o.threads);
  const at::Device device(o.device == "cuda" ? at::kCUDA : at::kCPU);
  TORCH_CHECK_VALUE(!device.is_cuda() || torch::cuda::is_available(),
                    "[bench] device must be cpu on this machine (no CUDA device available), got 'cuda'");
  log("[bench] threads: " + describe(set_cpu_threads(o.threads)));
  torch::manual_seed(o.seed);
  // The precision, read by the options registry (SimpleTuner's names, the ones remat lacks refused
  // by name); LoRA only.
  const models::BasePrecision precision = parse_base_model_precision_option(o.base_model_precision, "bench");
  const bool quantized = precision.mode != models::WeightQuantization::none;
  TORCH_CHECK_VALUE(!quantized || o.lora_rank > 0, "[bench] base_model_precision ", o.base_model_precision,
                    " quantises the frozen base, which only LoRA training has: pass --lora_rank > 0 (a full "
                    "fine-tune trains those weights)");

  if (!o.skip_memory_check) {
    ModelUse use;
    use.training = true;
    use.lora_rank = o.lora_rank;
    use.lora_target = o.lora_target;
    use.lora_flag = "--lora_rank=16";
    use.base_precision = precision;
    use.precision_flag = "--base_model_precision";
    admit_model(o.model, use, device);
  }
  // Built in full precision, cast, then quantised, so a bf16 run quantises bf16 weights and
  // never casts the quantised data or its scales (what make_transformer does for float32).
  TransformerSpec full = o.model;
  full.base_precision = models::BasePrecision{};
  auto model = make_transformer(full, device);
  const bool bf16 = o.dtype == "bfloat16";
  if (bf16) model->module().to(at::kBFloat16);
  if (quantized) models::quantize_linear_layers(model->module(), precision);
  if (o.lora_rank > 0) model->apply_lora(o.lora_target, o.lora_rank, static_cast<double>(o.lora_rank));
  model->module().train();
  std::vector<at::Tensor> params;
  int64_t trainable_count = 0;
  for (const auto& [name, p] : model->trainable_parameters()) {
    params.push_back(p);
    trainable_count += p.numel();
  }
  TORCH_CHECK_VALUE(!params.empty(), "[bench] the model has no trainable parameters");
  OptimizerSettings optimizer_options;
  optimizer_options.learning_rate = 1e-5;
  const auto optimizer_owner = make_optimizer(params, optimizer_options);
  torch::optim::Optimizer& optimizer = *optimizer_owner;
  at::Generator generator = at::detail::createCPUGenerator(o.seed);
  const Batch batch = model->synthetic_batch(o.batch, o.image_tokens, o.text_tokens, generator, device);
  StepSettings settings;
  if (bf16) settings.autocast = at::kBFloat16;
  const std::vector<int64_t> stacks = model->stack_sizes();
  for (const auto& name : o.layouts) parse_benchmark_layout(name, stacks);  // fail before any step

  // A first step (optimizer state, allocator, lazy initialisation), then the step model.
  model->set_checkpoint_plan(CheckpointPlan::simpletuner(true, std::nullopt, std::nullopt, "torch"));
  run_training_step(*model, optimizer, params, batch, settings, generator);
  StepProfileOptions profile_options;
  profile_options.ffn = true;
  log("[bench] profiling the step");
  const StepModel step_model = profile_step(*model, optimizer, params, batch, settings, generator, profile_options);
  const Layout keep_all = layout_keep_all(step_model.chain.num_blocks());
  const int64_t keep_all_peak = predict(step_model.chain, keep_all).peak_bytes;
  const int64_t min_peak = plan_layout(step_model.chain, 1).min_possible_peak;
  std::optional<DataParallelPrediction> data_parallel;
  if (o.world_size > 1) {
    int64_t weight_bytes = 0;
    for (const auto& p : model->module().parameters()) weight_bytes += static_cast<int64_t>(p.numel() * p.element_size());
    data_parallel = predict_data_parallel_memory(step_model.chain, keep_all, weight_bytes, params, optimizer_options,
                                                 o.world_size, o.lora_rank == 0);
  }

  const std::vector<std::string> names =
      o.layouts.empty() ? default_benchmark_layouts(device.is_cuda(), min_peak, keep_all_peak) : o.layouts;
  std::vector<BenchmarkLayout> layouts;
  std::vector<BenchmarkRecord> records;
  for (const auto& name : names) {
    BenchmarkLayout l = parse_benchmark_layout(name, stacks);
    BenchmarkRecord r;
    r.base_model_precision = o.base_model_precision;
    r.layout = name;
    Prediction prediction;
    switch (l.kind) {
      case BenchmarkLayout::Kind::Off:
        prediction = predict(step_model.chain, keep_all);
        r.chosen = "off";
        break;
      case BenchmarkLayout::Kind::Ffn:
        prediction = predict(*step_model.ffn_chain, keep_all);
        r.chosen = "ffn (torch-ffn: feed-forward parts checkpointed in every block)";
        break;
      case BenchmarkLayout::Kind::Chain:
        prediction = predict(step_model.chain, l.layout);
        r.chosen = describe_layout(l.layout);
        break;
      case BenchmarkLayout::Kind::Auto: {
        PlannerOptions planner;
        const PlanResult plan = plan_layout(step_model.chain, l.budget_bytes, planner);
        l.layout = plan.layout;
        prediction = plan.prediction;
        r.budget_bytes = l.budget_bytes;
        r.chosen = describe_layout(plan.layout) + (plan.fits ? "" : " (nothing fits: smallest peak)");
        log("[bench] " + name + " " + describe_plan(plan));
        break;
      }
    }
    r.predicted_peak_bytes = prediction.peak_bytes;
    r.predicted_step_s = prediction.step_s;
    layouts.push_back(l);
    records.push_back(r);
  }

  const auto plan_of = [&](const BenchmarkLayout& l) {
    switch (l.kind) {
      case BenchmarkLayout::Kind::Off: return CheckpointPlan::off();
      case BenchmarkLayout::Kind::Ffn:
        return CheckpointPlan::simpletuner(true, std::nullopt, std::nullopt, "torch-ffn");
      case BenchmarkLayout::Kind::Chain:
      case BenchmarkLayout::Kind::Auto: break;
    }
    return CheckpointPlan::from_layouts(split_stack_layout(l.layout, stacks));
  };
  std::vector<std::vector<StepMeasurement>> samples(layouts.size());
  for (int64_t round = 0; round < o.warmup + o.steps; ++round) {
    for (size_t i = 0; i < layouts.size(); ++i) {
      model->set_checkpoint_plan(plan_of(layouts[i]));
      const StepMeasurement m = run_training_step(*model, optimizer, params, batch, settings, generator);
      if (round >= o.warmup) samples[i].push_back(m);
    }
    log("[bench] round " + std::to_string(round + 1) + " of " + std::to_string(o.warmup + o.steps) +
        (round < o.warmup ? " (warm-up)" : ""));
  }

  BenchmarkReport report;
  report.data_parallel = data_parallel;
  for (size_t i = 0; i < layouts.size(); ++i) {
    BenchmarkRecord& r = records[i];
    std::vector<double> step, fwd, bwd, opt;
    for (const auto& m : samples[i]) {
      step.push_back(m.step_s);
      fwd.push_back(m.forward_s);
      bwd.push_back(m.backward_s);
      opt.push_back(m.optimizer_s);
      r.peak_bytes = std::max(r.peak_bytes, m.peak_bytes);
    }
    r.median_step_s = median(step);
    r.median_forward_s = median(fwd);
    r.median_backward_s = median(bwd);
    r.median_optimizer_s = median(opt);
    r.peak_error_pct = r.peak_bytes > 0 ? 100.0 * static_cast<double>(r.predicted_peak_bytes - r.peak_bytes) /
                                              static_cast<double>(r.peak_bytes)
                                        : 0.0;
    report.worst_peak_error_pct = std::max(report.worst_peak_error_pct, std::abs(r.peak_error_pct));
    report.records.push_back(r);
  }
  const auto find = [&](const std::string& name) -> const BenchmarkRecord* {
    for (const auto& r : report.records) {
      if (r.layout == name) return &r;
    }
    return nullptr;
  };
  if (const auto* per_block = find("1")) {
    if (const auto* off = find("off")) {
      double blocks_forward = 0.0;
      for (double s : step_model.block_forward_s) blocks_forward += s;
      report.overhead_ratio = per_block->median_step_s / (off->median_step_s + blocks_forward);
      report.overhead_ratio_measured_forward =
          per_block->median_step_s / (off->median_step_s + off->median_forward_s);
    }
  }

  std::ostringstream shape;
  shape << "batch " << o.batch << ", " << o.image_tokens << " image + " << o.text_tokens << " text tokens, "
        << o.dtype << (bf16 ? " (bf16 weights, bf16 autocast)" : "");
  std::ostringstream blocks;
  for (size_t i = 0; i < stacks.size(); ++i) blocks << (i ? " + " : "") << stacks[i];
  report.facts = {
      {"model", o.model.family + " " + (o.model.config_json ? *o.model.config_json : o.model.flavour) +
                    " (" + blocks.str() + " blocks)"},
      {"shape", shape.str()},
      {"training", o.lora_rank == 0 ? "full fine-tune" : "LoRA rank " + std::to_string(o.lora_rank) +
                                                             " on '" + o.lora_target + "'"},
      {"trainable parameters", std::to_string(trainable_count)},
      {"base_model_precision", o.base_model_precision +
                                   (quantized ? " (" + models::to_string(precision.mode) + " Linears, dequantised per layer)"
                                              : std::string(" (weights in the training dtype)"))},
      {"device", o.device + (device.is_cpu() ? ", " + std::to_string(at::get_num_threads()) + " threads" : "")},
      {"LibTorch", TORCH_VERSION},
      {"measurement", std::to_string(o.steps) + " steps after " + std::to_string(o.warmup) +
                          " warm-up rounds, layouts interleaved round-robin; medians; peak = max of "
                          "the steps' absolute peaks (memory::peak_bytes after a reset at step start)"},
  };
  if (data_parallel) {
    const DataParallelPrediction& d = *data_parallel;
    const std::string n = std::to_string(d.world_size);
    std::string line = "weights " + memory::format_bytes(d.weight_bytes) + ", gradients " +
                       memory::format_bytes(d.gradient_bytes) + "; plain data parallel: optimizer state " +
                       memory::format_bytes(d.optimizer_bytes) + ", step peak " +
                       memory::format_bytes(d.plain_peak_bytes) + " (layout off)";
    if (d.zero_peak_bytes > 0) {
      line += "; ZeRO-1: optimizer state " + memory::format_bytes(d.zero_optimizer_bytes) + " (largest of " + n +
              " shards) + broadcast buffer " + memory::format_bytes(d.zero_broadcast_bytes) + ", step peak " +
              memory::format_bytes(d.zero_peak_bytes) + "; saving " + memory::format_bytes(d.saving_bytes()) +
              " per process (" + std::to_string(static_cast<int>(std::lround(
                                     100.0 * static_cast<double>(d.saving_bytes()) /
                                     static_cast<double>(std::max<int64_t>(d.plain_peak_bytes, 1))))) +
              "%)";
    } else {
      line += "; ZeRO-1 applies to full fine-tunes only";
    }
    report.facts.emplace_back("per process, " + n + " processes (predicted)", line);
  }
  return report;
}

}  // namespace remat::train
