#pragma once
/// \file
/// `remat bench`: training-step time and peak memory of a transformer under several checkpoint
/// layouts, each next to what the step model (remat/train/memory/auto_layout.h) predicts for it.
/// Layouts are run round-robin (one step of each in turn, repeated) so drift in machine load
/// hits every layout alike; times are medians.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "remat/export.h"
#include "remat/plan.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/family/transformer.h"

namespace remat::train {

/// What to benchmark.
struct BenchmarkOptions {
  TransformerSpec model;
  int64_t image_tokens = 256;
  int64_t text_tokens = 64;
  int64_t batch = 1;
  /// "float32", or "bfloat16" (weights cast to bf16, forward under bf16 autocast).
  std::string dtype = "float32";
  /// "cpu" or "cuda".
  std::string device = "cpu";
  /// 0: full fine-tune; otherwise LoRA of this rank (alpha = rank) on `lora_target`.
  int64_t lora_rank = 0;
  /// Flux LoRA target preset; "default" = to_q, to_k, to_v, to_out.0 (as bench/flux_eager.py).
  std::string lora_target = "default";
  /// CPU threads; 0 keeps LibTorch's default; at most kMaxNumThreads.
  int64_t threads = 0;
  /// Build the model even when memory admission predicts it will not fit (remat/train/memory/admission.h).
  bool skip_memory_check = false;
  /// SimpleTuner's base_model_precision of the frozen base (remat/train/memory/base_precision.h):
  /// "no_change", or a quantised one (LoRA only: lora_rank > 0).
  std::string base_model_precision = "no_change";
  /// Layout names (see parse_benchmark_layout); empty: default_benchmark_layouts.
  std::vector<std::string> layouts;
  int64_t steps = 5;
  int64_t warmup = 1;
  uint64_t seed = 0;
  /// > 1: also predict the per-process memory of data-parallel training on this many processes,
  /// with and without ZeRO-1 (BenchmarkReport::data_parallel); the benchmark itself runs in one.
  int64_t world_size = 1;
};

/// A layout of the benchmark, parsed.
struct BenchmarkLayout {
  enum class Kind { Off, Chain, Ffn, Auto };
  std::string name;          ///< as written
  Kind kind = Kind::Off;
  Layout layout;             ///< Chain: over every block, stacks joined
  int64_t budget_bytes = 0;  ///< Auto
};

/// Parses one layout name for stacks of `stack_sizes` blocks: "off" (no checkpointing), "N"
/// (interval N, SimpleTuner's layout per stack), "N/S" (interval N, stride S), "ffn" (torch-ffn:
/// only feed-forward parts), "offload" (every block its own Offload checkpoint, unsloth),
/// "auto:SIZE" (the planner at a budget, e.g. "auto:20GiB", "auto:512MiB", "auto:1000000";
/// read by remat::parse_byte_size). Throws c10::ValueError naming the text and the
/// valid forms.
REMAT_API BenchmarkLayout parse_benchmark_layout(const std::string& name,
                                                 const std::vector<int64_t>& stack_sizes);

/// One row of the report.
struct BenchmarkRecord {
  std::string base_model_precision = "no_change";  ///< BenchmarkOptions::base_model_precision
  std::string layout;            ///< as written in the layout list
  std::string chosen;            ///< describe_layout of what ran (auto: the planner's choice)
  double median_step_s = 0.0;
  double median_forward_s = 0.0;
  double median_backward_s = 0.0;
  double median_optimizer_s = 0.0;
  int64_t peak_bytes = 0;        ///< max over measured steps of the absolute step peak
  int64_t predicted_peak_bytes = 0;
  double predicted_step_s = 0.0;
  /// 100 (predicted - measured) / measured.
  double peak_error_pct = 0.0;
  int64_t budget_bytes = 0;      ///< auto only
};

/// Per-process memory of data-parallel training on `world_size` processes, predicted from the
/// model and the step model measured here (the keep-all layout's peak). Data-parallel gradients
/// are views into the reducer's buckets, alive the whole step, so the blocks' gradients are
/// counted from the step's start (as with gradient accumulation); with ZeRO-1 the optimizer
/// state is the fullest rank's shard of the greedy assignment over the real tensors, plus the
/// weights' broadcast buffer after the update.
struct DataParallelPrediction {
  int64_t world_size = 1;
  int64_t weight_bytes = 0;          ///< every parameter, on every rank
  int64_t gradient_bytes = 0;        ///< every trainable tensor's gradient, on every rank
  int64_t optimizer_bytes = 0;       ///< the whole optimizer state (plain data parallel)
  int64_t zero_optimizer_bytes = 0;  ///< ZeRO-1: the fullest rank's shard (0 for LoRA: not offered)
  int64_t zero_broadcast_bytes = 0;  ///< ZeRO-1: the largest packed broadcast buffer
  int64_t plain_peak_bytes = 0;      ///< step peak per rank, plain data parallel
  int64_t zero_peak_bytes = 0;       ///< step peak per rank, ZeRO-1 (0 for LoRA)
  int64_t saving_bytes() const { return zero_peak_bytes > 0 ? plain_peak_bytes - zero_peak_bytes : 0; }
};

/// The whole result.
struct BenchmarkReport {
  /// Set when BenchmarkOptions::world_size > 1.
  std::optional<DataParallelPrediction> data_parallel;
  std::vector<BenchmarkRecord> records;
  /// "key: value" lines: model, shapes, device, threads, versions.
  std::vector<std::pair<std::string, std::string>> facts;
  /// Largest |peak_error_pct| over the records.
  double worst_peak_error_pct = 0.0;
  /// Overhead at the limit for layout "1" (when "1" and "off" both ran): step("1") /
  /// (step("off") + the profiled forward time of every block), and the same with the measured
  /// forward time of "off" (blocks + embedders + loss: an upper bound of what recomputation
  /// repeats) in the denominator.
  std::optional<double> overhead_ratio;
  std::optional<double> overhead_ratio_measured_forward;
};

/// The default list: off,1,2,4,8,2/4,ffn, offload on CUDA, and two auto budgets at 1/3 and 2/3
/// of the way from the smallest possible predicted peak to the keep-all predicted peak.
REMAT_API std::vector<std::string> default_benchmark_layouts(bool cuda, int64_t min_peak_bytes,
                                                             int64_t keep_all_peak_bytes);

/// Predicts DataParallelPrediction for `parameters` (the trainable tensors, optimizer
/// `settings`) of a model whose parameters take `weight_bytes`, from `chain` (the step model of
/// one process, taken before any gradient-persistence adjustment) at `layout`. `zero`: also the
/// ZeRO-1 figures.
REMAT_API DataParallelPrediction predict_data_parallel_memory(const Chain& chain, const Layout& layout,
                                                              int64_t weight_bytes,
                                                              const std::vector<at::Tensor>& parameters,
                                                              const OptimizerSettings& settings,
                                                              int64_t world_size, bool zero);

/// Runs the benchmark; `log` gets progress lines (may be empty). Needs CPU memory tracking
/// installed for a CPU run. Throws c10::ValueError / c10::Error for bad options.
REMAT_API BenchmarkReport run_benchmark(const BenchmarkOptions& options,
                                        const std::function<void(const std::string&)>& log = {});

}  // namespace remat::train
