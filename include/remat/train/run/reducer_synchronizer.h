#pragma once
/// \file
/// The training step's gradient-sync seam (GradientSynchronizer, remat/train/run/step.h) over c10d's
/// gradient reducer (remat/distributed/gradient_reducer.h): what `remat train` and the
/// data-parallel benchmark install on several processes.

#include "remat/distributed/gradient_reducer.h"
#include "remat/train/run/step.h"

namespace remat::train {

/// The reducer all-reduces inside the last micro-batch's backward, so finish() has nothing left
/// to wait for; the gradients are views into its buckets, so the step zeroes them instead of
/// freeing them.
class ReducerSynchronizer : public GradientSynchronizer {
 public:
  explicit ReducerSynchronizer(distributed::GradientReducer& reducer) : reducer_(reducer) {}
  void before_forward(bool last) override { reducer_.before_forward(last); }
  void before_backward(const at::Tensor& loss, bool last) override { reducer_.before_backward(loss, last); }
  void after_backward(bool last) override { reducer_.after_backward(last); }
  bool gradients_are_views() const override { return true; }

 private:
  distributed::GradientReducer& reducer_;
};

}  // namespace remat::train
