#pragma once
/// \file
/// Sharded optimizer state across the processes of a data-parallel run (ZeRO stage 1, as
/// PyTorch's ZeroRedundancyOptimizer does it): each trainable tensor is owned by one rank, which
/// alone keeps and updates its optimizer state; after every step each tensor is broadcast from its
/// owner, so every rank again holds all the weights. Per rank, the optimizer state shrinks to the
/// owned shard (AdamW: from 8 bytes per fp32 parameter to about 8 / world size).
///
/// Gradients: the GradientReducer all-reduces them in backward, so the full mean gradient is on
/// every rank when the step runs (clipping by global norm needs nothing more). DeepSpeed and
/// FairScale reduce-scatter instead, so each rank receives only its shard's gradients; Gloo in
/// LibTorch 1.13 has no reduce_scatter, so remat keeps the all-reduce on every backend. On NCCL a
/// reduce-scatter would halve the gradient traffic (each rank receives 1/W of the gradients
/// instead of all of them), at the cost of a second bucketing by owner.
///
/// Numerics: every rank builds the optimizer the single-process run builds (make_optimizer with
/// the run's OptimizerSettings) over the tensors it owns. An update depends only on its tensor,
/// its gradient and its state, so the owner computes the bits plain data parallel computes and
/// the broadcast copies them: ZeRO-1 equals plain data parallel bit for bit (torch-adamw,
/// optimi-lion). adamw_bf16 is refused (check_zero_run): its stochastic rounding draws from the
/// global generator per updated tensor, so with each rank updating only its shard the draws, and
/// the weights, would differ from plain data parallel's.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

#include "remat/export.h"
#include "remat/train/optimizers/optimizer.h"

namespace remat::distributed {
class ProcessGroup;
}

namespace remat::train {

/// The rank that owns each tensor, given the tensors' bytes in order: greedy, in order, each
/// tensor to the rank with the fewest bytes so far (the lowest rank on a tie), as PyTorch's
/// ZeroRedundancyOptimizer partitions (without its sort by size, so the assignment follows the
/// model's order). Deterministic: every rank computes the same. Throws c10::ValueError for
/// world_size < 1 or a negative size.
REMAT_API std::vector<int> assign_to_ranks(const std::vector<int64_t>& tensor_bytes, int world_size);

/// The bytes each rank owns under `owners` (assign_to_ranks's result).
REMAT_API std::vector<int64_t> bytes_per_rank(const std::vector<int64_t>& tensor_bytes,
                                              const std::vector<int>& owners, int world_size);

/// Bytes of optimizer state (optimizer_state_bytes) the fullest rank keeps with ZeRO-1 over
/// `parameters` on `world_size` ranks: the largest shard of assign_to_ranks's assignment (not
/// just 1/world_size of the whole: tensors are owned whole). world_size 1: the whole state.
REMAT_API int64_t zero_state_bytes_per_rank(const OptimizerSettings& settings,
                                            const std::vector<at::Tensor>& parameters, int world_size);

/// The ZeRO stage of SimpleTuner's deepspeed_config value: SimpleTuner's preset names "zero1"
/// (also zero0, and zero2 / zero3, refused below), JSON text starting with '{', or the path of a
/// JSON file (read through remat/util/files.h, bounded by remat/util/bounded_json.h), whose
/// zero_optimization.stage (or top-level zero_stage) is the stage; empty or "None": 0. Returns 0
/// or 1. Keys other than the stage do not apply to remat and are named in one warning (appended
/// to `warnings`). Throws ValidationError (option deepspeed_config) for stage 2 or 3 (remat
/// implements stage 1 only), a missing or non-integer stage, malformed JSON, or a value that is
/// none of the three forms.
REMAT_API int zero_stage_of(const std::string& deepspeed_config, std::vector<std::string>* warnings = nullptr);

/// The largest buffer ZeroRedundancyOptimizer packs for one broadcast over `parameters` on
/// `world_size` ranks (Note [ZeRO broadcasts]): the transient bytes of its weight broadcast.
REMAT_API int64_t zero_broadcast_buffer_bytes(const std::vector<at::Tensor>& parameters, int world_size,
                                              int64_t bucket_bytes = 25LL << 20);

/// Refuses a ZeRO configuration that cannot run: zero_stage 1 with model_type other than "full"
/// (a LoRA's state is small; SimpleTuner's preset requires a full fine-tune too), with adamw_bf16
/// (header comment), or, when world_size is known (> 0), with a single process (nothing to shard
/// across). Throws ValidationError naming deepspeed_config. zero_stage 0 passes. Option
/// validation calls it with world_size 0; the trainer again with its WORLD_SIZE.
REMAT_API void check_zero_run(int zero_stage, const std::string& model_type, const std::string& optimizer,
                              int world_size = 0);

/// ZeRO stage 1 over a process group. One parameter group holds every tensor, so
/// set_learning_rate(optimizer, lr) works as for any optimizer from make_optimizer; step()
/// forwards that learning rate to the rank's own optimizer, steps it, then broadcasts.
///
/// optimizer_state() refuses this optimizer (its state is sharded; use gather_full_state on
/// every rank); restore_optimizer_state(), optimizer_settings(), optimizer_state_fields() and
/// optimizer_has_state() accept it (remat/train/optimizers/optimizer.h).
class REMAT_API ZeroRedundancyOptimizer : public torch::optim::Optimizer {
 public:
  /// Broadcast buckets: an owner's tensors smaller than this are packed, in order, into buffers
  /// of at most this many bytes (one broadcast each); a larger tensor is broadcast in place.
  static constexpr int64_t kDefaultBucketBytes = 25LL << 20;

  /// `parameters`: every trainable tensor, in the same order on every rank (contiguous, on one
  /// device); `settings`: the run's optimizer (make_optimizer's). Collective only in step() and
  /// gather_full_state(). Throws ValidationError (check_zero_run) for adamw_bf16 or one process.
  ZeroRedundancyOptimizer(distributed::ProcessGroup& group, std::vector<at::Tensor> parameters,
                          const OptimizerSettings& settings, int64_t bucket_bytes = kDefaultBucketBytes);
  ~ZeroRedundancyOptimizer() override;

  /// The rank's optimizer steps the owned tensors (with the group's learning rate), then every
  /// tensor is broadcast from its owner. Collective: every rank calls it each step.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// Which rank owns parameters()[i].
  const std::vector<int>& owners() const { return owners_; }
  /// The tensors this rank updates, in order.
  const std::vector<at::Tensor>& owned_parameters() const { return owned_; }
  /// The optimizer over owned_parameters() (make_optimizer's).
  torch::optim::Optimizer& local_optimizer() { return *local_; }
  const torch::optim::Optimizer& local_optimizer() const { return *local_; }
  const OptimizerSettings& settings() const { return settings_; }
  /// Broadcasts (collectives) one step makes: one per bucket of each owner.
  int64_t broadcasts_per_step() const { return static_cast<int64_t>(buckets_.size()); }

  /// Collective: on rank 0, the state of every tensor in the format optimizer_state() gives for a
  /// single-process optimizer over the same `params` (names, fields, order, dtypes, devices), so a
  /// one-process run can restore it; on the other ranks, empty. Each owner sends its shard to
  /// every rank (c10d's ProcessGroup here has broadcast, not gather); ranks other than 0 drop it.
  std::vector<std::pair<std::string, at::Tensor>> gather_full_state(
      const std::vector<std::pair<std::string, at::Tensor>>& params);

  /// Not collective: restores, from a full state (a checkpoint of any world size, or a
  /// single-process optimizer_state()), the state of the tensors this rank owns; the rest is
  /// ignored. `params` as for gather_full_state. Errors as restore_optimizer_state's.
  void restore_full_state(const std::vector<std::pair<std::string, at::Tensor>>& params,
                          const std::vector<std::pair<std::string, at::Tensor>>& state);

 private:
  struct Bucket {
    int owner = 0;
    std::vector<size_t> tensors;  ///< indices into parameters_
    int64_t bytes = 0;
    bool in_place = false;        ///< one tensor of at least bucket_bytes, broadcast without a copy
  };
  void broadcast_parameters();

  distributed::ProcessGroup& group_;
  std::vector<at::Tensor> parameters_;
  OptimizerSettings settings_;
  std::vector<int> owners_;
  std::vector<at::Tensor> owned_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::vector<Bucket> buckets_;
};

}  // namespace remat::train
