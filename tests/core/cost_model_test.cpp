// predict() against peaks worked out by hand from Note [Checkpoint memory timeline], and its
// input validation.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "remat/plan.h"

namespace {
namespace cost_model_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::BlockCost;
using remat::BlockMode;
using remat::Chain;
using remat::Layout;

// A block whose state is 10 bytes in and out, gradients of 10 bytes, that keeps 100 bytes of
// activations plus its input (R = 10), peaks at activations + output in forward (F = 110) and 30
// above its start in backward. 1 s forward, 2 s backward.
BlockCost uniform_block() {
  BlockCost b;
  b.kind = "uniform";
  b.forward_s = 1.0;
  b.backward_s = 2.0;
  b.activation_bytes = 100;
  b.retained_input_bytes = 10;
  b.boundary_bytes = 10;
  b.boundary_grad_bytes = 10;
  b.output_bytes = 10;
  b.output_grad_bytes = 10;
  b.forward_peak_bytes = 110;
  b.backward_peak_bytes = 30;
  return b;
}

Chain three_blocks() {
  Chain chain;
  chain.blocks = {uniform_block(), uniform_block(), uniform_block()};
  return chain;
}

Layout layout(std::initializer_list<remat::Segment> segments) {
  Layout l;
  l.segments = segments;
  return l;
}

TEST(Predict, KeepAllByHand) {
  // live 10 (s0). fwd b0: peak 10+110=120, live 120. b1: peak 230, live 120+110-(10-10)=230.
  // b2: peak 340, live 340. + g3: 350. bwd b2: peak 350+30=380, live 350+10-100-10 = 250 (g3
  // held by the caller). b1: peak 280, live 250+10-100-10-10 = 140. b0: peak 170.
  const auto p = remat::predict(three_blocks(), remat::layout_keep_all(3));
  EXPECT_EQ(p.peak_bytes, 380);
  EXPECT_TRUE(p.peak_in_backward);
  EXPECT_EQ(p.peak_block, 2);
  EXPECT_DOUBLE_EQ(p.step_s, 9.0);
  EXPECT_DOUBLE_EQ(p.recompute_s, 0.0);
}

TEST(Predict, RecomputeFirstTwoByHand) {
  // fwd [0,2): b0 peak 120, live 120; b1 peak 230, live 230; graph dropped: -100-100-R1(10) = 20
  // (s0 + s2). keep b2: peak 130, live 130. + g3: 140. bwd b2: peak 170, live 40.
  // [0,2) backward: recompute b0 peak 150 (live 150), b1 peak 260 (live 260); inner b1 peak 290,
  // live 260+10-100-10 = 160 (g2 held by apply); b0 peak 190.
  Chain chain = three_blocks();
  const auto p = remat::predict(
      chain, layout({{0, 2, BlockMode::Recompute}, {2, 3, BlockMode::Keep}}));
  EXPECT_EQ(p.peak_bytes, 290);
  EXPECT_EQ(p.peak_block, 1);
  EXPECT_TRUE(p.peak_in_backward);
  EXPECT_DOUBLE_EQ(p.step_s, 11.0);  // 9 + recomputing b0 and b1
  EXPECT_DOUBLE_EQ(p.recompute_s, 2.0);

  // With 1000 fixed bytes and a 5-byte RNG snapshot per checkpoint, the peak (inner b1) is
  // 1000 + 290 + 5: the RNG state saved while recomputing is freed before the inner backward.
  chain.fixed_bytes = 1000;
  chain.checkpoint_overhead_bytes = 5;
  EXPECT_EQ(remat::predict(chain, layout({{0, 2, BlockMode::Recompute}, {2, 3, BlockMode::Keep}}))
                .peak_bytes,
            1295);
}

TEST(Predict, PerBlockRecomputeByHand) {
  // fwd: each segment peaks at (inputs kept so far) + 110 and leaves its input: live 40 at the end
  // (s0..s3), + g3: 50. bwd [2,3): recompute peak 160, inner peak 190 (160 + 30), live 70; apply
  // returns: -s3 (recomputed) -s2 (saved) → 50. [1,2): 50 + 110 + 30 = 190 again. [0,1): 40+140.
  const auto p = remat::predict(three_blocks(), remat::layout_from_interval(3, 1));
  EXPECT_EQ(p.peak_bytes, 190);
  EXPECT_DOUBLE_EQ(p.step_s, 12.0);
}

TEST(Predict, OffloadPrefetchByHand) {
  // State on CUDA: offloaded inputs leave the device (not s0: the caller holds it).
  // fwd: [0] peaks 120, leaves 20 (s0 + s1); [1] peaks 130, drops its graph (30) and moves s1
  // out (20); [2] the same: live 20 (s0 + s3). + g3: 30.
  // bwd [2]: fetch s2 (40), prefetch s1 (50); recompute peak 160, inner peak 190, live 70;
  // returns: -s3 -s2(fetched) → 50. [1]: already fetched; prefetch s0's host copy (60);
  // recompute peak 170, inner peak 200 ← the peak: the prefetched copy sits on top.
  Chain chain = three_blocks();
  chain.offload_to_host = true;
  chain.host_bandwidth_bytes_per_s = 5.0;  // 10 bytes take 2 s each way
  const Layout offload = remat::layout_from_interval(3, 1, std::nullopt, remat::Backend::Offload);
  const auto p = remat::predict(chain, offload);
  EXPECT_EQ(p.peak_bytes, 200);
  EXPECT_EQ(p.peak_block, 1);
  // Each segment: copy out 2 s - 1 s forward = 1 s exposed; copy back 2 s - 3 s = hidden.
  EXPECT_DOUBLE_EQ(p.transfer_s, 3.0);
  EXPECT_DOUBLE_EQ(p.step_s, 12.0 + 3.0);

  // On CPU offload keeps the inputs in place: the same as recompute.
  chain.offload_to_host = false;
  const auto cpu = remat::predict(chain, offload);
  EXPECT_EQ(cpu.peak_bytes, 190);
  EXPECT_DOUBLE_EQ(cpu.step_s, 12.0);
}

TEST(Predict, TwoBlocksWholeChainCheckpointCostsAnOutputCopy) {
  // Block 0 does not retain its input; block 1 does. fixed 1000.
  // keep: fwd b0 peak 1130, live 1120; b1 peak 1340, live 1330; + g2 1340; bwd b1 peak 1420.
  // recompute[0-1]: back to 1020 after forward, + g2 1030; recompute to 1350 (the recomputed s2
  // on top of the caller's); inner b1 peak 1430.
  Chain chain;
  BlockCost b0 = uniform_block(), b1 = uniform_block();
  b0.retained_input_bytes = 0;
  b0.forward_peak_bytes = 120;
  b0.backward_peak_bytes = 50;
  b1.activation_bytes = 200;
  b1.forward_peak_bytes = 220;
  b1.backward_peak_bytes = 80;
  chain.blocks = {b0, b1};
  chain.fixed_bytes = 1000;
  EXPECT_EQ(remat::predict(chain, remat::layout_keep_all(2)).peak_bytes, 1420);
  EXPECT_EQ(remat::predict(chain, layout({{0, 2, BlockMode::Recompute}})).peak_bytes, 1430);
}

void expect_invalid(const Chain& chain, const Layout& l, const std::string& needle) {
  try {
    remat::predict(chain, l);
    FAIL() << "expected c10::ValueError containing '" << needle << "'";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Predict, RejectsBadInput) {
  Chain chain = three_blocks();
  chain.blocks[1].activation_bytes = -1;
  expect_invalid(chain, remat::layout_keep_all(3), "blocks[1].activation_bytes must be >= 0, got -1");

  chain = three_blocks();
  chain.blocks[1].output_bytes = 11;
  expect_invalid(chain, remat::layout_keep_all(3), "blocks[1] output_bytes");

  chain = three_blocks();
  chain.forced_boundaries = {3};
  expect_invalid(chain, remat::layout_keep_all(3), "forced_boundaries must be in [1, 2]");

  chain = three_blocks();
  chain.forced_boundaries = {2};
  expect_invalid(chain, layout({{0, 3, BlockMode::Recompute}}),
                 "must not cross the forced boundary at block 2");
  expect_invalid(chain, remat::layout_keep_all(2), "segments must cover 3 blocks");
  EXPECT_EQ(remat::predict(chain, remat::layout_keep_all(3)).peak_bytes, 380);
  EXPECT_EQ(remat::predict(chain, remat::split_layout(layout({{0, 3, BlockMode::Recompute}}), {2}))
                .peak_bytes,
            remat::predict(chain, layout({{0, 2, BlockMode::Recompute}, {2, 3, BlockMode::Recompute}}))
                .peak_bytes);
}

// Note [Whole-step model]: parameter gradients created in backward, the head and loss after the
// chain, and the floor of the rest of the step, by hand on three uniform blocks kept.
TEST(Predict, WholeStepByHand) {
  Chain chain = three_blocks();
  // Forward as KeepAllByHand: live 340 after b2. The head and loss reach 340 + 50 = 390.
  chain.tail_peak_bytes = 50;
  chain.tail_backward_bytes = -10;
  auto p = remat::predict(chain, remat::layout_keep_all(3));
  EXPECT_EQ(p.peak_bytes, 390);
  EXPECT_EQ(p.peak_block, 3);
  EXPECT_FALSE(p.peak_in_backward);

  // Without the tail transient: + g3 - 10 = 340; b2's backward peaks at 370.
  chain.tail_peak_bytes = 0;
  EXPECT_EQ(remat::predict(chain, remat::layout_keep_all(3)).peak_bytes, 370);

  // 40 bytes of parameter gradients per block and a 200-byte backward transient in b0:
  // + g3 = 350; b2 live 350+10-100-10+40 = 290; b1 live 290+10-100-10-10+40 = 220; b0 peak 420.
  // Without the gradients b0 would peak at 140 + 200 = 340 and b2's 380 would be the peak.
  chain.tail_backward_bytes = 0;
  for (auto& b : chain.blocks) b.parameter_grad_bytes = 40;
  chain.blocks[0].backward_peak_bytes = 200;
  p = remat::predict(chain, remat::layout_keep_all(3));
  EXPECT_EQ(p.peak_bytes, 420);
  EXPECT_EQ(p.peak_block, 0);
  EXPECT_TRUE(p.peak_in_backward);

  // A floor from outside the chain (optimizer step) above everything, and its time.
  chain.fixed_peak_bytes = 1000;
  chain.fixed_time_s = 0.5;
  p = remat::predict(chain, remat::layout_keep_all(3));
  EXPECT_EQ(p.peak_bytes, 1000);
  EXPECT_EQ(p.peak_block, -1);
  EXPECT_DOUBLE_EQ(p.step_s, 9.5);

  chain.blocks[1].parameter_grad_bytes = -1;
  EXPECT_THROW(remat::predict(chain, remat::layout_keep_all(3)), c10::ValueError);
}

}  // namespace cost_model_test
}  // namespace
