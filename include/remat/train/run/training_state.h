#pragma once
/// \file
/// Resumable training checkpoints: `output_dir/checkpoint-<step>/` holding everything needed to
/// continue a run exactly where it stopped (on CPU, 5 steps + resume + 5 steps gives the same
/// weights bit for bit as 10 steps in one run):
///   trainable.safetensors  the trainable parameters, by name
///   optimizer.safetensors  the optimizer state per parameter (optimizer_state(), remat/train/optimizers/optimizer.h)
///   rng.safetensors        generator states (the global CPU one and the trainer's own)
///   state.json             step, data position, scheduler step and run facts
///   transformer_ema/ema_model.safetensors  with use_ema: the EMA weights by parameter name, the
///                          schedule's state as metadata (remat/train/run/ema.h)
/// A checkpoint is written to a temporary directory and renamed into place, so a crash leaves
/// either the old checkpoint or the new one, never half of one.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "remat/export.h"
#include "remat/io/safetensors.h"

namespace remat::train {

/// Where training stands; saved in state.json.
struct TrainingPosition {
  int64_t global_step = 0;      ///< optimizer steps completed
  int64_t epoch = 0;            ///< current epoch of the data order
  int64_t batch_in_epoch = 0;   ///< batches of `epoch` already consumed
};

/// Everything a checkpoint holds, as plain data.
struct TrainingCheckpoint {
  TrainingPosition position;
  std::vector<io::NamedTensor> trainable;   ///< parameter name -> value
  std::vector<io::NamedTensor> optimizer;   ///< see optimizer_state() (remat/train/optimizers/optimizer.h)
  std::vector<io::NamedTensor> rng;         ///< generator name -> state (uint8)
  std::map<std::string, std::string> facts; ///< free-form run facts kept in state.json
  std::vector<io::NamedTensor> ema;         ///< EMA weights by parameter name; empty: none saved
  std::map<std::string, std::string> ema_metadata;  ///< ExponentialMovingAverage::state's metadata
};

/// Writes `output_dir/checkpoint-<global_step>` atomically and returns its path. An existing
/// checkpoint of the same step is replaced.
REMAT_API std::string save_training_checkpoint(const std::string& output_dir,
                                               const TrainingCheckpoint& checkpoint);

/// Reads a checkpoint directory written by save_training_checkpoint. Throws c10::ValueError
/// naming the file (and the field) for a missing or corrupt part; state.json is read by
/// read_training_position. What the run needs of it is validate_training_checkpoint's to check.
REMAT_API TrainingCheckpoint load_training_checkpoint(const std::string& path);

/// Reads a checkpoint's state.json (a regular file, Note [Bounded JSON]): global_step an integer
/// in [0, kMaxTrainSteps], epoch and batch_in_epoch integers >= 0 (not 1.5, 1e30, true or past
/// int64), facts (when present, stored in `*facts`) an object of strings. Throws c10::ValueError
/// naming the file and the field.
REMAT_API TrainingPosition read_training_position(const std::string& state_path,
                                                  std::map<std::string, std::string>* facts = nullptr);

/// What a checkpoint must hold to resume a given run.
struct CheckpointExpectations {
  /// The trainable tensors (names and shapes), as Transformer::trainable_parameters lists them.
  std::vector<std::pair<std::string, std::vector<int64_t>>> trainable;
  /// Generator states that must be present, by name, with their sizes in bytes (-1: any size).
  std::map<std::string, int64_t> rng;
  /// Generator states that may be present (restored when they are), with their sizes (-1: any).
  std::map<std::string, int64_t> optional_rng;
  /// Batches per epoch of the run's dataset and batch size: batch_in_epoch may not exceed it.
  int64_t batches_per_epoch = 0;
  /// Batches per optimizer step: epoch may not exceed global_step times it.
  int64_t gradient_accumulation_steps = 1;
  /// The optimizer's state fields per trainable tensor (optimizer_state_fields).
  std::vector<std::string> optimizer_fields = {"exp_avg", "exp_avg_sq", "step"};
};

/// Checks `checkpoint` (read from directory `path`) against `expected` before anything is
/// restored: batch_in_epoch within the dataset's epoch, epoch at most the batches consumed;
/// trainable.safetensors holding exactly the trainable tensors with their shapes; after the
/// first step, optimizer.safetensors holding exactly the optimizer's fields per tensor (tensors of
/// the parameter's shape, or scalars; an int64 `step` within [1, global_step])
/// and step (an int64 scalar in [1, global_step]) of each (none at step 0); rng.safetensors
/// holding every required generator state and no unknown one, each U8 of its size. Throws
/// c10::ValueError naming the file and the tensor or field.
REMAT_API void validate_training_checkpoint(const TrainingCheckpoint& checkpoint, const std::string& path,
                                            const CheckpointExpectations& expected);

/// The checkpoint directories of `output_dir`, oldest (lowest step) first. Entries whose status
/// cannot be read (symlink loops) are skipped; a `checkpoint-<digits>` name whose step int64
/// cannot hold throws c10::ValueError naming it.
REMAT_API std::vector<std::string> list_training_checkpoints(const std::string& output_dir);

/// Cleans up after saves that were interrupted (kill -9, power loss): removes every
/// `.tmp-checkpoint-*` directory of `output_dir` (a save that never reached its rename), and for
/// each `.old-checkpoint-<step>-*` (a checkpoint being replaced) removes it when
/// `checkpoint-<step>` exists, or renames it back to `checkpoint-<step>` when the replacing save
/// stopped before its rename. Returns one line per action. Not safe while another run saves
/// into the same output_dir.
REMAT_API std::vector<std::string> remove_stale_checkpoint_temporaries(const std::string& output_dir);

/// Resolves `resume_from_checkpoint`: "latest" is the highest step in output_dir (nullopt when
/// there is none); anything else is a path that must be a checkpoint directory.
REMAT_API std::optional<std::string> resolve_resume_path(const std::string& resume_from_checkpoint,
                                                         const std::string& output_dir);

/// Deletes the oldest checkpoints so that at most `total_limit` remain (no-op for limit <= 0).
/// Returns the paths removed.
REMAT_API std::vector<std::string> prune_training_checkpoints(const std::string& output_dir,
                                                              int64_t total_limit);

}  // namespace remat::train
