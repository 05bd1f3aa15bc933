// remat::checkpoint: gradients, RNG, autocast, pass-through tensors, ownership, bad use.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include "core/test_support.h"
#include "remat/checkpoint.h"
#include "remat/compat.h"

namespace remat {
namespace {
namespace checkpoint_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using testing::expect_bitwise_equal;
using testing::grads_of;
using testing::max_abs_diff;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(1234); }
};

// A block with parameters inside and a conditioning vector captured from outside, like a
// transformer block reading the timestep embedding.
struct Block : torch::nn::Module {
  Block(int64_t dim) {
    fc1 = register_module("fc1", torch::nn::Linear(dim, 3 * dim));
    fc2 = register_module("fc2", torch::nn::Linear(3 * dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cond) {
    return x + fc2->forward(torch::gelu(fc1->forward(x * (1 + cond)), "tanh"));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct Model : torch::nn::Module {
  Model() {
    cond_proj = register_module("cond_proj", torch::nn::Linear(4, 8));
    block = register_module("block", std::make_shared<Block>(8));
  }
  torch::nn::Linear cond_proj{nullptr};
  std::shared_ptr<Block> block;
};

TEST_F(CheckpointTest, GradientsMatchForStateParametersAndCapturedTensors) {
  Model model;
  auto x = torch::randn({5, 8}, torch::requires_grad());
  auto t = torch::randn({1, 4});

  // Reference: no checkpointing.
  auto cond = model.cond_proj->forward(t);
  model.block->forward(x, cond).pow(2).sum().backward();
  const auto expected = grads_of(model);
  const auto expected_x = x.grad().clone();
  model.zero_grad();
  x.mutable_grad().reset();

  // The segment captures `cond`, made outside by a trainable layer; nobody lists it.
  auto cond2 = model.cond_proj->forward(t);
  auto out = checkpoint(
      [&model, cond2](const Tensors& s) { return Tensors{model.block->forward(s[0], cond2)}; },
      {x});
  out[0].pow(2).sum().backward();

  expect_bitwise_equal(expected, grads_of(model));
  EXPECT_TRUE(torch::equal(expected_x, x.grad())) << max_abs_diff(expected_x, x.grad());
  ASSERT_TRUE(model.cond_proj->weight.grad().defined()) << "gradient did not reach the captured tensor's producer";
}

TEST_F(CheckpointTest, AutogradGradComputesWithoutTouchingDotGrad) {
  Model model;
  auto x = torch::randn({5, 8}, torch::requires_grad());
  auto t = torch::randn({1, 4});
  auto cond = model.cond_proj->forward(t);
  auto ref = torch::autograd::grad({model.block->forward(x, cond).sum()},
                                   {x, model.block->fc1->weight, model.cond_proj->weight});

  auto cond2 = model.cond_proj->forward(t);
  auto out = checkpoint(
      [&model, cond2](const Tensors& s) { return Tensors{model.block->forward(s[0], cond2)}; },
      {x});
  auto got = torch::autograd::grad({out[0].sum()},
                                   {x, model.block->fc1->weight, model.cond_proj->weight});
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::equal(ref[i], got[i])) << "input " << i << " max diff " << max_abs_diff(ref[i], got[i]);
  }
  for (const auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_FALSE(x.grad().defined());
}

TEST_F(CheckpointTest, AutogradGradOnlyForInputsSkipsParameterWork) {
  Block block(6);
  auto x = torch::randn({3, 6}, torch::requires_grad());
  auto cond = torch::zeros({1, 6});
  auto ref = torch::autograd::grad({block.forward(x, cond).sum()}, {x})[0];
  auto out = checkpoint([&](const Tensors& s) { return Tensors{block.forward(s[0], cond)}; }, {x});
  auto got = torch::autograd::grad({out[0].sum()}, {x})[0];
  EXPECT_TRUE(torch::equal(ref, got));
  for (const auto& p : block.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST_F(CheckpointTest, RecomputesOnceInBackward) {
  Block block(4);
  auto x = torch::randn({2, 4}, torch::requires_grad());
  int calls = 0;
  auto out = checkpoint(
      [&](const Tensors& s) {
        ++calls;
        return Tensors{block.forward(s[0], torch::zeros({1, 4}))};
      },
      {x});
  EXPECT_EQ(calls, 1);
  out[0].sum().backward();
  EXPECT_EQ(calls, 2);
}

TEST_F(CheckpointTest, WithoutGradModeJustRunsTheFunction) {
  Block block(4);
  auto x = torch::randn({2, 4}, torch::requires_grad());
  int calls = 0;
  torch::NoGradGuard no_grad;
  auto out = checkpoint(
      [&](const Tensors& s) {
        ++calls;
        return Tensors{block.forward(s[0], torch::zeros({1, 4}))};
      },
      {x});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(out[0].requires_grad());
  EXPECT_TRUE(torch::equal(out[0], block.forward(x, torch::zeros({1, 4}))));
}

TEST_F(CheckpointTest, DropoutReplaysTheSameRandomNumbers) {
  Block block(16);
  auto x = torch::randn({8, 16}, torch::requires_grad());
  const auto run = [&](const Tensors& s) {
    return Tensors{torch::dropout(block.forward(s[0], torch::zeros({1, 16})), 0.5, /*train=*/true)};
  };
  torch::manual_seed(7);
  run({x})[0].pow(2).sum().backward();
  const auto expected = grads_of(block);
  const auto expected_x = x.grad().clone();
  block.zero_grad();
  x.mutable_grad().reset();

  torch::manual_seed(7);
  auto out = checkpoint(run, {x});
  // Draw random numbers between forward and backward: recomputation must not see them.
  torch::rand({1000});
  torch::manual_seed(99);
  const auto after_reseed = torch::rand({4});
  torch::manual_seed(99);
  out[0].pow(2).sum().backward();
  // Backward leaves the caller's generator where it was.
  EXPECT_TRUE(torch::equal(torch::rand({4}), after_reseed));

  expect_bitwise_equal(expected, grads_of(block));
  EXPECT_TRUE(torch::equal(expected_x, x.grad()));
}

TEST_F(CheckpointTest, WithoutPreservedRngDropoutMasksDiffer) {
  auto x = torch::ones({64, 64}, torch::requires_grad());
  const auto run = [](const Tensors& s) { return Tensors{torch::dropout(s[0], 0.5, true)}; };
  torch::manual_seed(3);
  auto reference = run({x})[0];
  reference.sum().backward();
  const auto expected = x.grad().clone();
  x.mutable_grad().reset();

  torch::manual_seed(3);
  CheckpointOptions options;
  options.preserve_rng_state = false;
  auto out = checkpoint(run, {x}, options);
  out[0].sum().backward();
  // The mask of recomputation comes from a later point of the stream: gradients differ. This is
  // what preserve_rng_state exists for.
  EXPECT_FALSE(torch::equal(expected, x.grad()));
}

TEST_F(CheckpointTest, AutocastStateOfForwardIsActiveInRecomputation) {
  Block block(16);
  auto x = torch::randn({8, 16}, torch::requires_grad());
  // Without the residual add (which promotes back to float32) the output dtype shows autocast.
  const auto run = [&](const Tensors& s) {
    return Tensors{block.fc2->forward(torch::gelu(block.fc1->forward(s[0]), "tanh"))};
  };

  const auto with_cpu_autocast = [](const std::function<void()>& body) {
    compat::set_autocast_dtype(c10::DeviceType::CPU, at::kBFloat16);
    compat::set_autocast_enabled(c10::DeviceType::CPU, true);
    at::autocast::increment_nesting();
    body();
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    compat::set_autocast_enabled(c10::DeviceType::CPU, false);
  };

  torch::Tensor reference_out;
  with_cpu_autocast([&] { reference_out = run({x})[0]; });
  ASSERT_EQ(reference_out.scalar_type(), at::kBFloat16) << "autocast did not take effect";
  reference_out.to(torch::kFloat).pow(2).sum().backward();  // backward outside the autocast region
  const auto expected = grads_of(block);
  const auto expected_x = x.grad().clone();
  block.zero_grad();
  x.mutable_grad().reset();

  torch::Tensor out;
  with_cpu_autocast([&] { out = checkpoint(run, {x})[0]; });
  ASSERT_EQ(out.scalar_type(), at::kBFloat16);
  out.to(torch::kFloat).pow(2).sum().backward();
  expect_bitwise_equal(expected, grads_of(block));
  EXPECT_TRUE(torch::equal(expected_x, x.grad())) << max_abs_diff(expected_x, x.grad());
  EXPECT_FALSE(compat::autocast_enabled(c10::DeviceType::CPU)) << "backward leaked autocast state";
}

TEST_F(CheckpointTest, UndefinedAndIntegerStatePassThrough) {
  Block block(4);
  auto x = torch::randn({2, 4}, torch::requires_grad());
  auto ids = torch::arange(6, torch::kLong);
  const auto run = [&](const Tensors& s) {
    EXPECT_FALSE(s[1].defined());
    return Tensors{block.forward(s[0], torch::zeros({1, 4})), s[1], s[2] + 1};
  };
  auto out = checkpoint(run, {x, torch::Tensor(), ids});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].defined());
  EXPECT_FALSE(out[2].requires_grad());
  EXPECT_EQ(out[2].scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(out[2], ids + 1));
  out[0].sum().backward();
  EXPECT_TRUE(x.grad().defined());
}

TEST_F(CheckpointTest, OutputsThatNeedNoGradGetNone) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto constant = torch::randn({3});
  auto out = checkpoint([&](const Tensors& s) { return Tensors{s[0] * 2, constant * 3}; }, {x});
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  EXPECT_TRUE(torch::equal(out[1], constant * 3));
}

TEST_F(CheckpointTest, PassThroughStateThatRequiresGrad) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto y = torch::randn({3}, torch::requires_grad());
  auto out = checkpoint([](const Tensors& s) { return Tensors{s[0].sin(), s[1]}; }, {x, y});
  (out[0] * 2 + out[1] * 3).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), 2 * x.cos()));
  EXPECT_TRUE(torch::equal(y.grad(), torch::full({3}, 3.0)));
}

TEST_F(CheckpointTest, KeepsItsOwnCopyOfTheFunction) {
  Block block(4);
  auto x = torch::randn({2, 4}, torch::requires_grad());
  Tensors out;
  {
    auto cond = torch::randn({1, 4});  // captured by value: safe after this scope ends
    SegmentFn temporary = [&block, cond](const Tensors& s) { return Tensors{block.forward(s[0], cond)}; };
    out = checkpoint(temporary, {x});
  }
  out[0].sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_TRUE(block.fc1->weight.grad().defined());
}

TEST_F(CheckpointTest, NestedCheckpointsGiveTheSameGradients) {
  Block a(6), b(6);
  auto x = torch::randn({4, 6}, torch::requires_grad());
  auto cond = torch::zeros({1, 6});
  b.forward(a.forward(x, cond), cond).sum().backward();
  const auto expected_a = grads_of(a), expected_b = grads_of(b);
  const auto expected_x = x.grad().clone();
  a.zero_grad();
  b.zero_grad();
  x.mutable_grad().reset();

  auto out = checkpoint(
      [&](const Tensors& s) {
        auto inner = checkpoint([&](const Tensors& t) { return Tensors{a.forward(t[0], cond)}; }, s);
        return Tensors{b.forward(inner[0], cond)};
      },
      {x});
  out[0].sum().backward();
  expect_bitwise_equal(expected_a, grads_of(a));
  expect_bitwise_equal(expected_b, grads_of(b));
  EXPECT_TRUE(torch::equal(expected_x, x.grad()));
}

TEST_F(CheckpointTest, OffloadBackendGivesIdenticalGradients) {
  Block block(8);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto cond = torch::randn({1, 8});
  const auto run = [&](const Tensors& s) { return Tensors{block.forward(s[0], cond)}; };
  checkpoint(run, {x})[0].sum().backward();
  const auto expected = grads_of(block);
  const auto expected_x = x.grad().clone();
  block.zero_grad();
  x.mutable_grad().reset();

  CheckpointOptions options;
  options.backend = Backend::Offload;
  checkpoint(run, {x}, options)[0].sum().backward();
  expect_bitwise_equal(expected, grads_of(block));
  EXPECT_TRUE(torch::equal(expected_x, x.grad()));
}

TEST_F(CheckpointTest, SecondBackwardWithoutRetainGraphIsAnError) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto out = checkpoint([](const Tensors& s) { return Tensors{s[0].exp()}; }, {x});
  auto loss = out[0].sum();
  loss.backward();
  try {
    loss.backward();
    FAIL() << "second backward did not throw";
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    EXPECT_TRUE(message.find("retain_graph") != std::string::npos) << message;
  }
}

TEST_F(CheckpointTest, SecondBackwardWithRetainGraphWorks) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto out = checkpoint([](const Tensors& s) { return Tensors{s[0].exp()}; }, {x});
  auto loss = out[0].sum();
  loss.backward({}, /*retain_graph=*/true);
  loss.backward();
  EXPECT_TRUE(torch::allclose(x.grad(), 2 * x.exp()));
}

TEST_F(CheckpointTest, CreateGraphThroughACheckpointIsAClearError) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto out = checkpoint([](const Tensors& s) { return Tensors{s[0].pow(3)}; }, {x});
  try {
    torch::autograd::grad({out[0].sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "create_graph=true did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("create_graph=true"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointTest, InPlaceChangeOfAnInputAfterForwardIsDetected) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto h = x * 1;  // non-leaf input, modified in place after the checkpoint read it
  auto out = checkpoint([](const Tensors& s) { return Tensors{s[0].sin()}; }, {h});
  {
    torch::NoGradGuard no_grad;
    h.add_(1);
  }
  try {
    out[0].sum().backward();
    FAIL() << "in-place modification was not detected";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointTest, BackendNames) {
  EXPECT_EQ(backend_name(Backend::Recompute), "torch");
  EXPECT_EQ(backend_name(Backend::Offload), "unsloth");
  EXPECT_EQ(parse_backend("unsloth"), Backend::Offload);
  try {
    parse_backend("cuda");
    FAIL();
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'cuda'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("torch, unsloth"), std::string::npos);
  }
}

}  // namespace checkpoint_test
}  // namespace
}  // namespace remat
