#pragma once
/// \file
/// Resumable training checkpoints: `output_dir/checkpoint-<step>/` holding everything needed to
/// continue a run exactly where it stopped (on CPU, 5 steps + resume + 5 steps gives the same
/// weights bit for bit as 10 steps in one run):
///   trainable.safetensors  the trainable parameters, by name
///   optimizer.safetensors  the optimizer state per parameter (optimizer_state(), remat/train/optimizer.h)
///   rng.safetensors        generator states (the global CPU one and the trainer's own)
///   state.json             step, data position, scheduler step and run facts
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
  std::vector<io::NamedTensor> optimizer;   ///< see optimizer_state() (remat/train/optimizer.h)
  std::vector<io::NamedTensor> rng;         ///< generator name -> state (uint8)
  std::map<std::string, std::string> facts; ///< free-form run facts kept in state.json
};

/// Writes `output_dir/checkpoint-<global_step>` atomically and returns its path. An existing
/// checkpoint of the same step is replaced.
REMAT_API std::string save_training_checkpoint(const std::string& output_dir,
                                               const TrainingCheckpoint& checkpoint);

/// Reads a checkpoint directory written by save_training_checkpoint. Throws naming the file for
/// a missing or corrupt part.
REMAT_API TrainingCheckpoint load_training_checkpoint(const std::string& path);

/// The checkpoint directories of `output_dir`, oldest (lowest step) first.
REMAT_API std::vector<std::string> list_training_checkpoints(const std::string& output_dir);

/// Resolves `resume_from_checkpoint`: "latest" is the highest step in output_dir (nullopt when
/// there is none); anything else is a path that must be a checkpoint directory.
REMAT_API std::optional<std::string> resolve_resume_path(const std::string& resume_from_checkpoint,
                                                         const std::string& output_dir);

/// Deletes the oldest checkpoints so that at most `total_limit` remain (no-op for limit <= 0).
/// Returns the paths removed.
REMAT_API std::vector<std::string> prune_training_checkpoints(const std::string& output_dir,
                                                              int64_t total_limit);

}  // namespace remat::train
