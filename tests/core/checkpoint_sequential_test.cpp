// checkpoint_sequential_state and layouts: segment boundaries, gradients, validation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/test_support.h"
#include "remat/checkpoint.h"
#include "remat/layout.h"

namespace remat {
namespace {
namespace checkpoint_sequential_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using testing::expect_bitwise_equal;
using testing::grads_of;
using testing::max_abs_diff;

class SequentialTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(2024); }
};

// A block carrying a tuple state (image, text), like a Flux double block.
struct PairBlock : torch::nn::Module {
  explicit PairBlock(int64_t dim) {
    img = register_module("img", torch::nn::Linear(dim, dim));
    txt = register_module("txt", torch::nn::Linear(dim, dim));
  }
  Tensors forward(const Tensors& s) {
    auto mixed = torch::tanh(img->forward(s[0]) + txt->forward(s[1]).mean(0, true));
    return {s[0] + mixed, s[1] + torch::sigmoid(txt->forward(s[1]))};
  }
  torch::nn::Linear img{nullptr}, txt{nullptr};
};

struct PairChain : torch::nn::Module {
  PairChain(int64_t n, int64_t dim) {
    for (int64_t i = 0; i < n; ++i) {
      blocks.push_back(register_module("b" + std::to_string(i), std::make_shared<PairBlock>(dim)));
    }
  }
  std::vector<std::shared_ptr<PairBlock>> blocks;
};

// SimpleTuner's test: a 4-block tuple-carrying sequence with segment size 2 gives the same
// gradients for the inputs and every parameter as running the blocks directly.
TEST_F(SequentialTest, TupleStateGradientsMatchDirect) {
  PairChain chain(4, 6);
  auto img = torch::randn({5, 6}, torch::requires_grad());
  auto txt = torch::randn({3, 6}, torch::requires_grad());
  const RunBlock run = [&](int64_t i, const Tensors& s) { return chain.blocks[i]->forward(s); };

  Tensors direct{img, txt};
  for (int64_t i = 0; i < 4; ++i) direct = run(i, direct);
  (direct[0].sum() + direct[1].pow(2).sum()).backward();
  const auto expected = grads_of(chain);
  const auto expected_img = img.grad().clone(), expected_txt = txt.grad().clone();
  chain.zero_grad();
  img.mutable_grad().reset();
  txt.mutable_grad().reset();

  auto out = checkpoint_sequential_state(4, 2, {img, txt}, run);
  EXPECT_TRUE(torch::equal(out[0], direct[0]));
  (out[0].sum() + out[1].pow(2).sum()).backward();
  expect_bitwise_equal(expected, grads_of(chain));
  EXPECT_TRUE(torch::equal(expected_img, img.grad())) << max_abs_diff(expected_img, img.grad());
  EXPECT_TRUE(torch::equal(expected_txt, txt.grad())) << max_abs_diff(expected_txt, txt.grad());
}

// SimpleTuner's test: blocks [1,2,3,4,5] with segment size 2 sum to 15, with calls
// checkpoint,0,1,checkpoint,2,3,checkpoint,4.
TEST_F(SequentialTest, ContiguousChunksCallOrder) {
  const std::vector<int64_t> values{1, 2, 3, 4, 5};
  std::vector<std::string> calls;
  const RunBlock run = [&](int64_t i, const Tensors& s) {
    calls.push_back(std::to_string(i));
    return Tensors{s[0] + values[i]};
  };
  const CheckpointFn counting = [&](const SegmentFn& fn, const Tensors& s) {
    calls.push_back("checkpoint");
    return fn(s);
  };
  auto out = checkpoint_sequential_state(5, 2, {torch::zeros({1})}, run, counting);
  EXPECT_EQ(out[0].item<float>(), 15.0f);
  const std::vector<std::string> expected{"checkpoint", "0", "1", "checkpoint", "2", "3", "checkpoint", "4"};
  EXPECT_EQ(calls, expected);
}

TEST_F(SequentialTest, StrideLeavesGapBlocksUncheckpointed) {
  std::vector<std::string> calls;
  bool inside = false;
  const RunBlock run = [&](int64_t i, const Tensors& s) {
    calls.push_back((inside ? "c" : "p") + std::to_string(i));
    return Tensors{s[0] + 1};
  };
  const CheckpointFn counting = [&](const SegmentFn& fn, const Tensors& s) {
    inside = true;
    auto out = fn(s);
    inside = false;
    return out;
  };
  checkpoint_sequential_state(6, 2, {torch::zeros({1})}, run, counting, 3);
  const std::vector<std::string> expected{"c0", "c1", "p2", "c3", "c4", "p5"};
  EXPECT_EQ(calls, expected);
}

TEST_F(SequentialTest, SegmentWindows) {
  const auto w = segment_windows(5, 2);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].begin, 0);
  EXPECT_EQ(w[0].checkpoint_end, 2);
  EXPECT_EQ(w[2].begin, 4);
  EXPECT_EQ(w[2].checkpoint_end, 5);
  EXPECT_EQ(w[2].end, 5);
  const auto strided = segment_windows(7, 2, 3);
  ASSERT_EQ(strided.size(), 3u);
  EXPECT_EQ(strided[1].begin, 3);
  EXPECT_EQ(strided[1].checkpoint_end, 5);
  EXPECT_EQ(strided[1].end, 6);
  EXPECT_EQ(strided[2].checkpoint_end, 7);
  EXPECT_TRUE(segment_windows(0, 3).empty());
}

TEST_F(SequentialTest, RecomputationCountMatchesThePlan) {
  // Interval 2, stride 3 over 7 blocks: checkpointed blocks 0,1,3,4,6 run twice, gaps 2,5 once.
  std::vector<int> runs(7, 0);
  auto w = torch::randn({4, 4}, torch::requires_grad());
  const RunBlock run = [&](int64_t i, const Tensors& s) {
    ++runs[i];
    return Tensors{torch::tanh(s[0].matmul(w))};
  };
  auto x = torch::randn({2, 4}, torch::requires_grad());
  auto out = checkpoint_sequential_state(7, 2, {x}, run, CheckpointOptions{}, 3);
  out[0].sum().backward();
  const std::vector<int> expected{2, 2, 1, 2, 2, 1, 2};
  EXPECT_EQ(runs, expected);
}

template <typename Fn>
std::string value_error_message(Fn&& fn) {
  try {
    fn();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "(no c10::ValueError thrown)";
}

TEST_F(SequentialTest, BadArgumentsNameTheParameterAndValue) {
  const RunBlock run = [](int64_t, const Tensors& s) { return s; };
  const Tensors state{torch::zeros({1})};
  EXPECT_EQ(value_error_message([&] { checkpoint_sequential_state(4, 0, state, run); }),
            "[checkpoint_sequential_state] segment_size must be >= 1, got 0");
  EXPECT_EQ(value_error_message([&] { checkpoint_sequential_state(-1, 2, state, run); }),
            "[checkpoint_sequential_state] num_blocks must be >= 0, got -1");
  EXPECT_EQ(value_error_message([&] { checkpoint_sequential_state(4, 3, state, run, CheckpointOptions{}, 2); }),
            "[checkpoint_sequential_state] segment_stride must be >= segment_size (3), got 2");
}

TEST_F(SequentialTest, BlockChangingStateSizeNamesTheBlock) {
  const RunBlock run = [](int64_t i, const Tensors& s) {
    return i == 2 ? Tensors{s[0]} : s;
  };
  auto a = torch::randn({2}, torch::requires_grad());
  auto b = torch::randn({2}, torch::requires_grad());
  try {
    checkpoint_sequential_state(4, 2, {a, b}, run);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("block 2 returned 1 state tensors, expected 2"), std::string::npos) << message;
  }
}

TEST_F(SequentialTest, LayoutFromIntervalMatchesWindows) {
  const auto layout = layout_from_interval(7, 2, 3);
  EXPECT_EQ(describe_layout(layout), "recompute[0-1] keep[2] recompute[3-4] keep[5] recompute[6]");
  EXPECT_EQ(layout.num_blocks(), 7);
  EXPECT_EQ(layout.num_checkpoints(), 3);
  EXPECT_EQ(describe_layout(layout_from_interval(3, 1, std::nullopt, Backend::Offload)),
            "offload[0] offload[1] offload[2]");
  EXPECT_EQ(describe_layout(layout_keep_all(4)), "keep[0-3]");
}

TEST_F(SequentialTest, ValidateLayoutRejectsGapsAndWrongTotals) {
  Layout gap;
  gap.segments = {{0, 2, BlockMode::Keep}, {3, 4, BlockMode::Recompute}};
  EXPECT_EQ(value_error_message([&] { validate_layout(gap, 4); }),
            "[Layout] segment 1 must cover blocks [2, end > begin), got [3, 4)");
  EXPECT_EQ(value_error_message([&] { validate_layout(layout_keep_all(3), 4); }),
            "[Layout] segments must cover 4 blocks, got 3");
}

TEST_F(SequentialTest, RunLayoutGradientsMatchDirect) {
  PairChain chain(6, 5);
  auto img = torch::randn({4, 5}, torch::requires_grad());
  auto txt = torch::randn({2, 5}, torch::requires_grad());
  const RunBlock run = [&](int64_t i, const Tensors& s) { return chain.blocks[i]->forward(s); };
  Tensors direct{img, txt};
  for (int64_t i = 0; i < 6; ++i) direct = run(i, direct);
  (direct[0].sum() + direct[1].sum()).backward();
  const auto expected = grads_of(chain);
  const auto expected_img = img.grad().clone();
  chain.zero_grad();
  img.mutable_grad().reset();

  Layout layout;
  layout.segments = {{0, 2, BlockMode::Recompute}, {2, 3, BlockMode::Keep},
                     {3, 4, BlockMode::Offload}, {4, 6, BlockMode::Recompute}};
  auto out = run_layout(layout, {img, txt}, run);
  (out[0].sum() + out[1].sum()).backward();
  expect_bitwise_equal(expected, grads_of(chain));
  EXPECT_TRUE(torch::equal(expected_img, img.grad()));
}

}  // namespace checkpoint_sequential_test
}  // namespace
}  // namespace remat
