// Data-parallel gradients through c10d::Reducer (remat/distributed/gradient_reducer.h).
#include "remat/distributed/gradient_reducer.h"

#include <chrono>
#include <mutex>
#include <unordered_map>

#include "process_group_impl.h"
#include "remat/util/error.h"

// Note [Reduction during recomputation]
// A checkpointed segment's backward runs the segment's forward again and then an inner backward
// through it, with the inner engine capturing the gradients of the segment's inputs (the
// trainable weights among them) instead of accumulating them. The checkpoint node returns those
// gradients to the outer backward, whose AccumulateGrad nodes write .grad and run the reducer's
// hooks. So a bucket whose tensors all live in the last segments is complete, and its all-reduce
// in flight, while the outer backward goes on to recompute the earlier segments: communication
// overlaps recomputation exactly as it overlaps plain backward in DistributedDataParallel.
// tests/distributed shows it: buckets launch while segments are still to be recomputed.

namespace remat::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// What the hook shares with the reducer wrapper (the hook itself is owned by the c10d reducer).
struct HookCounters {
  std::mutex mutex;
  int64_t launched = 0;
  double seconds = 0.0;
};

// c10d's AllReduceCommHook (divide by the world size, then sum) plus an observer and timing.
class ObservedAllReduce : public c10d::CommHookInterface {
 public:
  ObservedAllReduce(c10::intrusive_ptr<c10d::ProcessGroup> group, LaunchEnvironment env,
                    std::function<void(const BucketLaunch&)> on_bucket, std::shared_ptr<HookCounters> counters)
      : group_(std::move(group)),
        env_(std::move(env)),
        on_bucket_(std::move(on_bucket)),
        counters_(std::move(counters)) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    at::Tensor& buffer = bucket.getBufferRef();
    if (on_bucket_) {
      on_bucket_(BucketLaunch{bucket.getIndex(), static_cast<int64_t>(buffer.numel() * buffer.element_size()),
                              bucket.getParameters().size()});
    }
    buffer.div_(env_.world_size);
    std::vector<at::Tensor> tensors{buffer};
    auto future = group_->allreduce(tensors)->getFuture();
    const auto start = Clock::now();
    {
      std::lock_guard<std::mutex> lock(counters_->mutex);
      ++counters_->launched;
    }
    // The reducer waits for this future at the end of backward: a failed all-reduce (a rank that
    // died or hung) surfaces there, with this message instead of Gloo's socket error alone.
    auto counters = counters_;
    const std::string why = "the all-reduce of gradient bucket " + std::to_string(bucket.getIndex());
    const LaunchEnvironment env = env_;
    return future->then(
        [counters, start, why, env](c10::ivalue::Future& done) -> c10::IValue {
          {
            std::lock_guard<std::mutex> lock(counters->mutex);
            counters->seconds += std::chrono::duration<double>(Clock::now() - start).count();
          }
          if (done.hasError()) throw_value_error(collective_failure_message(env, why, done.tryRetrieveErrorMessage()));
          return done.value();
        },
        future->elementType());
  }

  at::Tensor parseHookResult(const c10::IValue& result) override {
    return result.isTensor() ? result.toTensor() : result.toTensorVector()[0];
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  LaunchEnvironment env_;
  std::function<void(const BucketLaunch&)> on_bucket_;
  std::shared_ptr<HookCounters> counters_;
};

}  // namespace

struct GradientReducer::Impl {
  LaunchEnvironment env;
  std::unique_ptr<c10d::Reducer> reducer;
  std::shared_ptr<HookCounters> counters = std::make_shared<HookCounters>();
  int64_t synchronised = 0;
  int64_t launched_before_backward = 0;
};

GradientReducer::GradientReducer(ProcessGroup& group, std::vector<at::Tensor> parameters,
                                 std::vector<std::string> names, ReducerOptions options)
    : impl_(std::make_unique<Impl>()), parameters_(std::move(parameters)) {
  TORCH_CHECK_VALUE(!parameters_.empty(), "[distributed] the gradient reducer needs at least one trainable tensor");
  TORCH_CHECK_VALUE(names.size() == parameters_.size(), "[distributed] ", names.size(), " names for ",
                    parameters_.size(), " trainable tensors");
  TORCH_CHECK_VALUE(options.bucket_cap_bytes > 0 && options.first_bucket_cap_bytes > 0,
                    "[distributed] bucket sizes must be positive, got ", options.bucket_cap_bytes, " and ",
                    options.first_bucket_cap_bytes);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    TORCH_CHECK_VALUE(parameters_[i].requires_grad(), "[distributed] trainable tensor '", names[i],
                      "' does not require a gradient");
  }
  impl_->env = group.environment();
  const auto& pg = group.impl().group;
  const std::vector<bool> sparse(parameters_.size(), false);
  // DDP's assignment: the last-registered tensors (whose gradients are ready first in backward)
  // in the first, small bucket; then buckets of bucket_cap_bytes, one dtype and device each.
  std::vector<at::Tensor> reversed(parameters_.rbegin(), parameters_.rend());
  std::vector<int64_t> order(parameters_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(order.size() - 1 - i);
  auto assignment = c10d::compute_bucket_assignment_by_size(
      reversed, {static_cast<size_t>(options.first_bucket_cap_bytes), static_cast<size_t>(options.bucket_cap_bytes)},
      std::vector<bool>(parameters_.size(), false), order);
  std::unordered_map<size_t, std::string> param_names;
  for (size_t i = 0; i < names.size(); ++i) param_names.emplace(i, names[i]);
  with_collective_errors(impl_->env, "creating the gradient reducer", [&]() {
    impl_->reducer = compat::make_reducer(
        parameters_, std::get<0>(assignment), std::get<1>(assignment), pg, sparse, options.bucket_cap_bytes,
        options.find_unused_parameters, /*gradient_as_bucket_view=*/true, param_names,
        options.first_bucket_cap_bytes);
  });
  impl_->reducer->register_comm_hook(std::make_unique<ObservedAllReduce>(
      pg, impl_->env, std::move(options.on_bucket), impl_->counters));
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::before_forward(bool synchronise) {
  with_collective_errors(impl_->env, "preparing the gradient buckets", [&]() {
    // As DistributedDataParallel's forward: after the first synchronised backward, the buckets are
    // rebuilt once in the order gradients became ready (a collective: rank 0's order wins).
    impl_->reducer->rebuild_buckets();
    if (synchronise) impl_->reducer->prepare_for_forward();
  });
}

void GradientReducer::before_backward(const at::Tensor& loss, bool synchronise) {
  if (!synchronise) return;  // the hooks stay idle: gradients accumulate locally
  std::lock_guard<std::mutex> lock(impl_->counters->mutex);
  impl_->launched_before_backward = impl_->counters->launched;
  impl_->reducer->prepare_for_backward({loss});
}

void GradientReducer::after_backward(bool synchronise) {
  if (!synchronise) return;
  ++impl_->synchronised;
  int64_t launched = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->counters->mutex);
    launched = impl_->counters->launched - impl_->launched_before_backward;
  }
  const auto expected = static_cast<int64_t>(bucket_count());
  TORCH_CHECK(launched == expected, "[distributed] ", impl_->env.describe(), ": backward all-reduced ", launched,
              " of ", expected,
              " gradient buckets: some trainable tensor got no gradient in this step, so the ranks' "
              "gradients would differ");
}

size_t GradientReducer::bucket_count() const {
  return impl_->reducer->get_grad_buckets(/*return_zero_tensors=*/false).size();
}

ReducerStats GradientReducer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->counters->mutex);
  ReducerStats s;
  s.synchronised_backwards = impl_->synchronised;
  s.buckets_launched = impl_->counters->launched;
  s.all_reduce_seconds = impl_->counters->seconds;
  return s;
}

}  // namespace remat::distributed
