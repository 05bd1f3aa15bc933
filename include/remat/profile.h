#pragma once
/// \file
/// Measuring what a block costs (remat/plan.h's BlockCost) at the shapes of a training step: its
/// forward and backward time and the device memory it keeps and uses. CPU figures come from the
/// tracking allocator (memory::install_cpu_tracking must have run), CUDA figures from the caching
/// allocator's statistics (remat::memory).

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <c10/core/Device.h>

#include "remat/checkpoint.h"
#include "remat/export.h"
#include "remat/plan.h"

namespace remat {

struct ProfileOptions {
  /// Untimed runs first (allocator warm-up, lazy initialisation, gradients allocated).
  int warmup = 1;
  /// Timed runs; times are their medians, memory figures their maxima.
  int repeats = 3;
  /// The block's trainable parameters when training frees gradients between steps
  /// (zero_grad(set_to_none)): their `.grad` is reset to undefined before every run, so
  /// backward_peak_bytes includes creating them and parameter_grad_bytes is what they take after
  /// the backward. Empty: gradients are left alone (measure with them allocated).
  std::vector<at::Tensor> parameters;
};

/// Runs `block` forward (grad enabled) and backward `warmup + repeats` times on fresh copies of
/// `state` (same shapes, dtypes, devices and requires_grad flags) and measures a BlockCost:
/// - forward_s / backward_s: medians, with the device synchronised around each pass;
/// - boundary_bytes / output_bytes: unique storage bytes of the input / returned state;
///   boundary_grad_bytes / output_grad_bytes: bytes of the gradients of those that require grad;
/// - activation_bytes, retained_input_bytes: what the graph keeps after forward once the caller
///   has dropped the input (the part of the input still alive is the retained input);
/// - forward_peak_bytes / backward_peak_bytes: peaks above the bytes live when each pass starts;
///   the backward starts from a gradient of the output that only autograd holds, as in a chain.
/// The device is that of the first defined state tensor. Measure in the state training runs in:
/// parameter gradients allocated (as after a first step), same dtype / autocast, grad enabled.
///
/// Side effects: gradients accumulate into the `.grad` of parameters the block uses (zero them
/// afterwards); RNG state advances. Throws c10::ValueError for an empty callable, a state
/// with no defined tensor, warmup < 0 or repeats < 1, and c10::Error when CPU tracking is not
/// installed (for a CPU state) or the block changes the number of state tensors.
REMAT_API BlockCost profile_block(const SegmentFn& block, const Tensors& state,
                                  const std::string& kind, const ProfileOptions& options = {});

/// Same, for block `block_index` of a sequence run by `run_block`.
REMAT_API BlockCost profile_block(const RunBlock& run_block, int64_t block_index,
                                  const Tensors& state, const std::string& kind,
                                  const ProfileOptions& options = {});

/// Bytes of the distinct storages behind `tensors` (undefined ones count 0): what keeping them
/// alive costs. Use it for Chain::fixed_bytes (parameters, gradients, optimizer state).
REMAT_API int64_t storage_bytes(const Tensors& tensors);

/// Bytes each checkpoint keeps on `device` besides its inputs (Chain::checkpoint_overhead_bytes):
/// the CPU generator state snapshot for a CPU device, 0 for accelerators (the snapshots live in
/// host memory).
REMAT_API int64_t checkpoint_overhead_bytes(c10::Device device);

}  // namespace remat
