// remat::OffloadSavedTensors: what autograd saves inside a scope goes to host memory and comes
// back with the same values and strides, so gradients are bitwise those of a plain run; the
// tracked bytes between forward and backward drop; prefetch runs one scope ahead; the host
// buffer pool honours its cap.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/activation_offload.h"
#include "remat/memory.h"
#include "value_error.h"

namespace remat {
namespace {
namespace activation_offload_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using testing::error_of;

struct Net {
  at::Tensor w1, w2, x;
};

Net make_net() {
  torch::manual_seed(11);
  return {torch::randn({64, 96}, torch::requires_grad()), torch::randn({48, 64}, torch::requires_grad()),
          torch::randn({32, 64}, torch::requires_grad())};
}

// Two "blocks", each optionally inside a scope; views with gaps (narrow, transpose) and ops
// that save their outputs (softmax, tanh) on the way.
at::Tensor forward(const Net& n, const std::optional<SavedTensorOffload>& offload) {
  at::Tensor h = n.x;
  for (int block = 0; block < 2; ++block) {
    const OffloadSavedTensors scope(offload);
    const at::Tensor a = at::matmul(h, n.w1);                       // (32, 96)
    const at::Tensor left = a.narrow(1, 8, 64);                      // a view with gaps
    const at::Tensor s = at::softmax(left.t().contiguous().t(), 1);  // saves its output
    h = at::tanh(at::matmul(s * left, n.w2.t()).narrow(1, 0, 48)).matmul(n.w2);
  }
  return (h * h).sum();
}

std::vector<at::Tensor> gradients(const std::optional<SavedTensorOffload>& offload, int backwards = 1) {
  Net n = make_net();
  at::Tensor loss = forward(n, offload);
  for (int i = 0; i < backwards; ++i) {
    for (auto* t : {&n.w1, &n.w2, &n.x}) t->mutable_grad() = at::Tensor();
    loss.backward({}, /*retain_graph=*/i + 1 < backwards);
  }
  return {n.w1.grad(), n.w2.grad(), n.x.grad()};
}

void expect_bitwise(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << "gradient " << i;
}

TEST(ActivationOffloadTest, GradientsAreBitwiseThoseOfAPlainRun) {
  const auto plain = gradients(std::nullopt);
  reset_saved_tensor_offload_stats();
  expect_bitwise(gradients(SavedTensorOffload{}), plain);
  const SavedTensorOffloadStats s = saved_tensor_offload_stats();
  EXPECT_GT(s.tensors_offloaded, 0);
  EXPECT_GT(s.tensors_kept, 0);  // the weights, leaves, stay where they are
  EXPECT_GT(s.bytes_to_host, 0);
  EXPECT_EQ(s.bytes_to_device, s.bytes_to_host);  // every offloaded tensor came back once
  EXPECT_EQ(s.prefetched, 0);
}

TEST(ActivationOffloadTest, BackwardTwiceWithRetainGraphUnpacksAgain) {
  const auto plain = gradients(std::nullopt, 2);
  reset_saved_tensor_offload_stats();
  expect_bitwise(gradients(SavedTensorOffload{}, 2), plain);
  const SavedTensorOffloadStats s = saved_tensor_offload_stats();
  EXPECT_EQ(s.bytes_to_device, 2 * s.bytes_to_host);
}

TEST(ActivationOffloadTest, PrefetchRunsOneScopeAheadWithTheSameGradients) {
  const auto plain = gradients(std::nullopt);
  reset_saved_tensor_offload_stats();
  expect_bitwise(gradients(SavedTensorOffload{/*prefetch=*/true}), plain);
  const SavedTensorOffloadStats s = saved_tensor_offload_stats();
  // Backward unpacks the second block first and prefetches the whole first block then.
  EXPECT_GT(s.prefetched, 0);
  EXPECT_LT(s.prefetched, s.tensors_offloaded);
  EXPECT_EQ(s.bytes_to_device, s.bytes_to_host);
}

TEST(ActivationOffloadTest, TrackedBytesUntilBackwardDropToTheLeavesAndTheLoss) {
  ASSERT_TRUE(memory::cpu_tracking_installed());
  auto held_after_forward = [](const std::optional<SavedTensorOffload>& offload) {
    Net n = make_net();
    const int64_t before = memory::current_bytes();
    at::Tensor loss = forward(n, offload);
    const int64_t held = memory::current_bytes() - before;
    loss.backward();
    return held;
  };
  const int64_t plain = held_after_forward(std::nullopt);
  reset_saved_tensor_offload_stats();
  const int64_t offloaded = held_after_forward(SavedTensorOffload{});
  const int64_t moved = saved_tensor_offload_stats().bytes_to_host;
  EXPECT_GT(plain, 64 * 1024) << "the activations should dominate what the graph holds";
  EXPECT_LT(offloaded, plain / 8) << "plain " << plain << " B, offloaded " << offloaded << " B";
  EXPECT_GE(moved, plain - offloaded);  // what left the tracked pool went to the host
}

TEST(ActivationOffloadTest, ADisabledInnerScopeKeepsItsTensors) {
  Net n = make_net();
  reset_saved_tensor_offload_stats();
  {
    const OffloadSavedTensors outer(SavedTensorOffload{});
    const OffloadSavedTensors inner(std::nullopt);
    at::Tensor loss = at::tanh(at::matmul(n.x, n.w1)).sum();
    loss.backward();
  }
  EXPECT_EQ(saved_tensor_offload_stats().tensors_offloaded, 0);
  {
    const OffloadSavedTensors outer(SavedTensorOffload{});
    at::Tensor loss = at::tanh(at::matmul(n.x, n.w1)).sum();
    loss.backward();
  }
  EXPECT_GT(saved_tensor_offload_stats().tensors_offloaded, 0);
}

TEST(ActivationOffloadTest, ThePoolReusesBuffersAndHandsOutPageableOnesBeyondItsCap) {
  release_offload_pool();
  set_offload_pin_memory_max_buckets(1);
  reset_offload_pool_stats();
  reset_saved_tensor_offload_stats();
  gradients(SavedTensorOffload{});
  OffloadPoolStats first = offload_pool_stats();
  EXPECT_EQ(first.buckets, 1);
  EXPECT_GT(first.cap_misses, 0) << "the net saves tensors of several shapes";
  EXPECT_EQ(first.checkouts, saved_tensor_offload_stats().tensors_offloaded);
  EXPECT_EQ(first.pooled_checkouts + first.cap_misses, first.checkouts);
  EXPECT_GT(first.idle_buffers, 0);  // given back after backward
  EXPECT_GT(first.pooled_bytes, 0);

  reset_offload_pool_stats();
  gradients(SavedTensorOffload{});
  const OffloadPoolStats second = offload_pool_stats();
  EXPECT_EQ(second.reuses, second.pooled_checkouts) << "the second step finds its buffers";
  EXPECT_EQ(second.pooled_bytes, first.pooled_bytes);

  set_offload_pin_memory_max_buckets(0);
  EXPECT_EQ(offload_pool_stats().buckets, 0);
  reset_offload_pool_stats();
  expect_bitwise(gradients(SavedTensorOffload{}), gradients(std::nullopt));
  EXPECT_EQ(offload_pool_stats().pooled_checkouts, 0);
  EXPECT_EQ(offload_pool_stats().cap_misses, offload_pool_stats().checkouts);

  EXPECT_NE(error_of([] { set_offload_pin_memory_max_buckets(-1); }).find("got -1"), std::string::npos);
  set_offload_pin_memory_max_buckets(kDefaultOffloadPinMemoryMaxBuckets);
  release_offload_pool();
  EXPECT_EQ(offload_pool_stats().buckets, 0);
}

}  // namespace activation_offload_test
}  // namespace
}  // namespace remat
