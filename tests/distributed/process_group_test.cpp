// The process group and the gradient reducer in one process: rendezvous failures, and buckets
// that fire during a checkpointed backward's recomputation.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "rank_processes.h"
#include "remat/checkpoint.h"
#include "remat/distributed/gradient_reducer.h"
#include "remat/distributed/process_group.h"
#include "value_error.h"

namespace remat::distributed {
namespace {
namespace process_group_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;

LaunchEnvironment local(int rank, int world, int port, int timeout_seconds) {
  LaunchEnvironment env;
  env.rank = rank;
  env.world_size = world;
  env.local_rank = rank;
  env.local_world_size = world;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  env.timeout = std::chrono::seconds(timeout_seconds);
  return env;
}

// A port some other program listens on.
class Occupied {
 public:
  Occupied() : port_(remat::testing::free_port()), fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(port_));
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(::listen(fd_, 1), 0);
  }
  ~Occupied() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int port_;
  int fd_;
};

TEST(ProcessGroup, PortInUseIsAClearError) {
  Occupied occupied;
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { ProcessGroup::connect(local(0, 2, occupied.port(), 30), Backend::gloo); });
  EXPECT_NE(message.find("rank 0 could not open the rendezvous store at 127.0.0.1:" + std::to_string(occupied.port())),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("choose another MASTER_PORT"), std::string::npos) << message;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
}

TEST(ProcessGroup, UnreachableMasterFailsAfterTheTimeout) {
  const int port = remat::testing::free_port();  // nobody listens
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { ProcessGroup::connect(local(1, 2, port, 2), Backend::gloo); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("rank 1 of 2 could not reach rank 0's rendezvous store at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("within 2 s (SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS)"), std::string::npos) << message;
  EXPECT_LT(seconds, 20.0);
}

// Note [Reduction during recomputation]: 4 checkpointed segments of one Linear each, one bucket
// per weight. Backward recomputes segment 3 first; its weight's bucket must launch before the
// earlier segments are recomputed, and every bucket must launch once.
TEST(GradientReducer, BucketsFireWhileSegmentsAreStillToBeRecomputed) {
  auto group = ProcessGroup::connect(local(0, 1, remat::testing::free_port(), 30), Backend::gloo);
  torch::manual_seed(0);
  std::vector<torch::nn::Linear> layers;
  std::vector<at::Tensor> weights;
  std::vector<std::string> names;
  for (int i = 0; i < 4; ++i) {
    layers.emplace_back(torch::nn::LinearOptions(16, 16).bias(false));
    weights.push_back(layers.back()->weight);
    names.push_back("layer" + std::to_string(i) + ".weight");
  }
  std::atomic<int> forwards{0};
  std::vector<int> forwards_at_launch;
  ReducerOptions options;
  options.bucket_cap_bytes = 1;  // one tensor per bucket
  options.first_bucket_cap_bytes = 1;
  options.on_bucket = [&](const BucketLaunch& launch) { forwards_at_launch.push_back(forwards.load()); };
  GradientReducer reducer(*group, weights, names, options);
  EXPECT_EQ(reducer.bucket_count(), 4u);

  const at::Tensor x = torch::randn({8, 16}).requires_grad_(true);
  const auto run_block = [&](int64_t i, const Tensors& state) -> Tensors {
    ++forwards;
    return {torch::tanh(layers[i]->forward(state[0]))};
  };
  reducer.before_forward(true);
  const at::Tensor loss = checkpoint_sequential_state(4, 1, {x}, run_block)[0].pow(2).sum();
  ASSERT_EQ(forwards.load(), 4);
  reducer.before_backward(loss, true);
  loss.backward();
  reducer.after_backward(true);

  ASSERT_EQ(forwards_at_launch.size(), 4u);
  EXPECT_EQ(forwards.load(), 8);  // each segment recomputed once
  // The first bucket (the last layer's weight) launched after one recomputation, with three to go.
  EXPECT_EQ(forwards_at_launch.front(), 5);
  EXPECT_EQ(forwards_at_launch.back(), 8);
  EXPECT_EQ(reducer.stats().buckets_launched, 4);
  EXPECT_EQ(reducer.stats().synchronised_backwards, 1);

  // One process: the reduced gradient is the local one (divided by a world of 1).
  std::vector<at::Tensor> reference_grads;
  {
    std::vector<at::Tensor> copies;
    for (const auto& w : weights) copies.push_back(w.detach().clone().requires_grad_(true));
    at::Tensor h = x;
    for (const auto& w : copies) h = torch::tanh(torch::matmul(h, w.t()));
    h.pow(2).sum().backward();
    for (const auto& w : copies) reference_grads.push_back(w.grad());
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_TRUE(torch::allclose(weights[i].grad(), reference_grads[i], 1e-5, 1e-6)) << names[i];
  }
}

// A step's non-final micro-batches accumulate without reducing; the last one reduces them all.
TEST(GradientReducer, AccumulatesLocallyUntilTheLastMicroBatch) {
  auto group = ProcessGroup::connect(local(0, 1, remat::testing::free_port(), 30), Backend::gloo);
  torch::manual_seed(1);
  torch::nn::Linear layer(torch::nn::LinearOptions(8, 4));
  std::vector<at::Tensor> params{layer->weight, layer->bias};
  GradientReducer reducer(*group, params, {"weight", "bias"});
  const at::Tensor a = torch::randn({3, 8}), b = torch::randn({3, 8});
  for (int micro = 0; micro < 2; ++micro) {
    const bool last = micro == 1;
    reducer.before_forward(last);
    const at::Tensor loss = layer->forward(micro == 0 ? a : b).sum() / 2;
    reducer.before_backward(loss, last);
    loss.backward();
    reducer.after_backward(last);
    EXPECT_EQ(reducer.stats().buckets_launched, last ? static_cast<int64_t>(reducer.bucket_count()) : 0);
  }
  // d/dW of (sum(W a + c) + sum(W b + c)) / 2: the column sums of a and b, halved.
  const at::Tensor expected = ((a.sum(0) + b.sum(0)) / 2).unsqueeze(0).expand({4, 8});
  EXPECT_TRUE(torch::allclose(layer->weight.grad(), expected, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(layer->bias.grad(), torch::full({4}, 3.0), 1e-6, 1e-6));
}

}  // namespace process_group_test
}  // namespace
}  // namespace remat::distributed
