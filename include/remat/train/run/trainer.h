#pragma once
/// \file
/// `remat train`: flow-matching training of Flux / MageFlow, LoRA or full fine-tune, with
/// segmented activation checkpointing, resumable checkpoints and run reporting.

#include <atomic>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "remat/export.h"
#include "remat/train/options/config.h"
#include "remat/train/run/progress.h"
#include "remat/train/validation/validation_images.h"

namespace remat::train {

/// What the caller provides besides the configuration.
struct TrainerHooks {
  /// Receives log lines (warnings, the chosen layout, saved files). Default: stderr.
  std::function<void(const std::string&)> log;
  /// Set (for example by a SIGINT handler) to stop after the current step: the trainer saves a
  /// checkpoint and returns with `interrupted` set.
  const std::atomic<bool>* stop_requested = nullptr;
  /// Whether to draw a redrawn progress bar (a terminal) or plain log lines.
  bool progress_is_terminal = false;
  /// Called after every optimizer step (after metrics are written), for UIs and tests.
  std::function<void(const StepRecord&)> on_step;
  /// Where the progress display goes. Default: stdout.
  std::FILE* progress_stream = nullptr;
};

struct TrainResult {
  std::vector<StepRecord> records;   ///< the steps run by this invocation
  RunSummary summary;
  std::string weights_path;          ///< the LoRA or full weights written at the end ("" if none)
  /// With use_ema: the EMA weights written beside them (ema/ for LoRA, transformer_ema/ for full).
  std::string ema_weights_path;
  std::string last_checkpoint;       ///< the last training checkpoint written ("" if none)
  int64_t final_step = 0;
  bool interrupted = false;
  /// Each validation of this invocation (time, peak memory, files), in order.
  std::vector<ValidationRun> validations;
};

/// Runs training as `config` says (validated by load_train_config). Throws ValidationError for
/// problems found only now (missing data directory, weights that do not fit the model).
REMAT_API TrainResult run_training(const TrainConfig& config, const TrainerHooks& hooks = {});

/// The file names written into output_dir.
inline constexpr const char* kLoraWeightsFile = "pytorch_lora_weights.safetensors";
inline constexpr const char* kFullWeightsFile = "transformer/diffusion_pytorch_model.safetensors";
inline constexpr const char* kMetricsFile = "metrics.jsonl";

}  // namespace remat::train
