#pragma once
/// \file
/// Data-parallel gradient synchronisation through c10d::Reducer, the bucketed all-reduce behind
/// PyTorch's DistributedDataParallel, driven from C++.
///
/// The reducer registers a hook on each trainable tensor's gradient accumulator. During a
/// synchronising backward, as the gradients of a bucket's tensors are all final, the bucket's
/// all-reduce starts (on Gloo's or NCCL's own threads) while backward goes on with earlier
/// layers; at backward's end the reducer waits for the last buckets, and every rank holds the
/// mean gradient. remat's checkpoints recompute a segment inside the outer backward and hand its
/// gradients back to the outer graph, so the accumulator hooks, and with them the buckets, fire
/// in the outer backward between recomputations (Note [Reduction during recomputation] in
/// gradient_reducer.cpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "remat/distributed/process_group.h"
#include "remat/export.h"

namespace remat::distributed {

/// A bucket's all-reduce starting, as a ReducerOptions::on_bucket observer sees it.
struct BucketLaunch {
  size_t bucket = 0;        ///< the bucket's index (the last bucket fires first in backward)
  int64_t bytes = 0;        ///< its flattened gradients
  size_t tensors = 0;       ///< how many trainable tensors it holds
};

struct ReducerOptions {
  /// Bucket size (DistributedDataParallel's bucket_cap_mb = 25).
  int64_t bucket_cap_bytes = 25LL << 20;
  /// The first bucket (the last layers' gradients, ready first) is kept small so communication
  /// starts early, as DistributedDataParallel does (1 MiB).
  int64_t first_bucket_cap_bytes = 1LL << 20;
  /// Tolerate trainable tensors that get no gradient in a step (DDP's find_unused_parameters):
  /// the reducer then walks the autograd graph each step to find them.
  bool find_unused_parameters = false;
  /// Called on the backward thread as each bucket's all-reduce starts (tests, benchmarks).
  std::function<void(const BucketLaunch&)> on_bucket;
};

/// What the reducer has done so far.
struct ReducerStats {
  int64_t synchronised_backwards = 0;  ///< backward passes whose gradients were all-reduced
  int64_t buckets_launched = 0;
  /// Sum over buckets of the seconds from a bucket's launch to its all-reduce's completion
  /// (counted only with on_bucket set, which installs the timing hook).
  double all_reduce_seconds = 0.0;
};

/// Keeps the gradients of `parameters` equal on every rank: their mean over the ranks after each
/// synchronising backward. Gradients become views into the reducer's buckets (no second copy),
/// so between steps they are zeroed, never freed (Gradients::zero).
class REMAT_API GradientReducer {
 public:
  /// `parameters`: the trainable tensors, in the same order on every rank (their gradients are
  /// reduced); `names` (same length) appear in c10d's error messages.
  GradientReducer(ProcessGroup& group, std::vector<at::Tensor> parameters, std::vector<std::string> names,
                  ReducerOptions options = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// Before each micro-batch's forward. `synchronise`: this micro-batch's backward reduces (the
  /// last micro-batch of a step); the others only accumulate locally.
  void before_forward(bool synchronise);
  /// After the forward, before backward of `loss` (the tensor backward starts from).
  void before_backward(const at::Tensor& loss, bool synchronise);
  /// After the synchronising backward: checks that it reduced (a backward that never reached the
  /// trainable tensors would otherwise leave ranks apart silently).
  void after_backward(bool synchronise);

  /// The buckets now (after the first synchronised backward they are rebuilt once, in the order
  /// the gradients became ready, as DistributedDataParallel does).
  size_t bucket_count() const;
  ReducerStats stats() const;
  const std::vector<at::Tensor>& parameters() const { return parameters_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<at::Tensor> parameters_;
};

}  // namespace remat::distributed
