// remat::memory tracking, and the memory claim of checkpointing: forward keeps only segment
// boundaries. Peaks are measured with the tracking allocator and compared with an analytical
// figure derived below from what autograd saves.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>
#include <torch/torch.h>

#include "remat/checkpoint.h"
#include "remat/memory.h"

namespace remat {
namespace {
namespace memory_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

TEST(MemoryTracking, CountsLiveTensorBytesAndPeak) {
  ASSERT_TRUE(memory::cpu_tracking_installed());
  const int64_t before = memory::current_bytes();
  memory::reset_peak();
  {
    auto a = torch::empty({1000}, torch::kFloat);  // 4000 bytes
    EXPECT_EQ(memory::current_bytes() - before, 4000);
    {
      auto b = torch::empty({250}, torch::kDouble);  // 2000 bytes
      EXPECT_EQ(memory::current_bytes() - before, 6000);
    }
    EXPECT_EQ(memory::current_bytes() - before, 4000);
  }
  EXPECT_EQ(memory::current_bytes(), before);
  EXPECT_EQ(memory::peak_bytes() - before, 6000);
  memory::reset_peak();
  EXPECT_EQ(memory::peak_bytes(), memory::current_bytes());
}

TEST(MemoryTracking, PeakScopeMeasuresTheRegion) {
  auto keep = torch::empty({1 << 10}, torch::kFloat);
  memory::PeakScope scope;
  { auto t = torch::empty({1 << 12}, torch::kFloat); }
  EXPECT_EQ(scope.peak_delta(), 4 << 12);
}

// Without a CUDA device (a CPU build, or a CUDA build on a machine without one) the CUDA figures
// are an error naming what is missing; with one they are the caching allocator's (tests/gpu).
TEST(MemoryTracking, CudaFiguresNeedACudaDevice) {
  const c10::Device cuda(c10::kCUDA, 0);
  if (torch::cuda::is_available()) {
    EXPECT_GE(memory::peak_bytes(cuda), memory::current_bytes(cuda));
    return;
  }
  const std::string want = memory::cuda_statistics_available() ? "need a CUDA device" : "need a CUDA build";
  try {
    memory::peak_bytes(cuda);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

// A step that allocates and frees the same 20 blocks of 3 MiB: with glibc's own start the first
// free raises its limits to 3 MiB mapped / 6 MiB kept, so every later step's 60 MiB come from the
// heap and go back to the kernel when freed, faulting about 15,000 pages in again per step
// (measured once outside this suite with Debian's LibTorch: 65,888 page faults in 5 steps). Kept
// as host blocks (the step's peak allows 60 MiB of them), the steps take no new pages.
TEST(MemoryTracking, FreedHostMemoryIsReusedStepAfterStep) {
  ASSERT_TRUE(remat::memory::reuse_freed_host_memory()) << "GLIBC_TUNABLES or MALLOC_*_ set in the environment?";
  const auto minor_faults = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<int64_t>(usage.ru_minflt);
  };
  const auto step = [] {
    std::vector<at::Tensor> blocks;
    for (int i = 0; i < 20; ++i) blocks.push_back(at::empty({3 << 20}, at::kByte).fill_(1));
  };
  for (int i = 0; i < 4; ++i) step();  // the heap settles
  const int64_t before = minor_faults();
  for (int i = 0; i < 5; ++i) step();
  const int64_t faults = minor_faults() - before;
  // Without reuse, about 5 x 15,360 (a step's pages); allow a quarter of one step.
  const int64_t step_pages = int64_t{20} * (3 << 20) / 4096;
  EXPECT_LT(faults, step_pages / 4) << "5 steps of 60 MiB took " << faults << " new pages";
}

// The resident set of this process, from /proc/self/status.
int64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmRSS:  123 kB"
  }
  ADD_FAILURE() << "no VmRSS in /proc/self/status";
  return 0;
}

// Blocks of growing sizes, each freed once the next is allocated, with a small tensor kept from
// each round between them: in malloc's heap every freed block is too small for the next and is
// pinned by the small tensor above it, so the heap grows by every block (131 MiB for 32 MiB of
// tensors under the fixed limits remat set before host blocks: 32 MiB mapped, 64 MiB kept). As
// host blocks the freed ones go back to the kernel: the process holds little more than the
// tensors' peak.
TEST(MemoryTracking, TheResidentSetStaysNearTheTensorsPeak) {
  ASSERT_TRUE(remat::memory::reuse_freed_host_memory()) << "GLIBC_TUNABLES or MALLOC_*_ set in the environment?";
  memory::release_cached_host_memory();
  const int64_t rss_before = resident_bytes();
  const int64_t tensors_before = memory::current_bytes();
  memory::reset_peak();
  int64_t rss_peak = rss_before;
  std::vector<at::Tensor> kept;
  at::Tensor block;
  for (int mib = 4; mib <= 16; ++mib) {
    at::Tensor next = at::empty({int64_t{mib} << 20}, at::kByte).fill_(1);
    block = next;  // frees the previous block
    kept.push_back(at::empty({96 << 10}, at::kByte).fill_(1));
    rss_peak = std::max(rss_peak, resident_bytes());
  }
  const int64_t tensors_peak = memory::peak_bytes() - tensors_before;
  const int64_t grown = rss_peak - rss_before;
  EXPECT_LE(grown, tensors_peak + (8 << 20))
      << "the resident set grew by " << memory::format_bytes(grown) << " for tensors peaking at "
      << memory::format_bytes(tensors_peak);
}

// A freed block is handed out again, whole or split: a smaller request takes the front of the
// free range and the next one the pages after it. release_cached_host_memory hands the kept
// blocks back to the kernel.
TEST(MemoryTracking, FreedBlocksServeLaterRequestsWholeOrSplit) {
  ASSERT_TRUE(remat::memory::reuse_freed_host_memory());
  memory::release_cached_host_memory();
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto address = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); };
  uintptr_t first = 0;
  {
    at::Tensor a = at::empty({6 << 20}, at::kByte).fill_(1);
    first = address(a);
  }
  {
    at::Tensor b = at::empty({6 << 20}, at::kByte);
    EXPECT_EQ(address(b), first) << "a 6 MiB request did not reuse the freed 6 MiB block";
  }
  {
    at::Tensor c = at::empty({2 << 20}, at::kByte);
    at::Tensor d = at::empty({3 << 20}, at::kByte);
    EXPECT_EQ(address(c), first) << "a 2 MiB request did not take the front of the free 6 MiB";
    // c's block: its 2 MiB and the allocator's header, in whole pages.
    const uintptr_t c_block = (address(d) - address(c));
    EXPECT_EQ(c_block % page, 0u);
    EXPECT_GE(c_block, uintptr_t{2} << 20);
    EXPECT_LE(c_block, (uintptr_t{2} << 20) + page) << "the 3 MiB request did not take the pages after c";
  }
  std::vector<at::Tensor> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(at::empty({4 << 20}, at::kByte).fill_(1));
  blocks.clear();  // 64 MiB freed and kept
  const int64_t rss_kept = resident_bytes();
  memory::release_cached_host_memory();
  EXPECT_GE(rss_kept - resident_bytes(), int64_t{56} << 20) << "the kept blocks stayed resident";
}

TEST(MemoryTracking, FormatBytes) {
  EXPECT_EQ(memory::format_bytes(512), "512 B");
  EXPECT_EQ(memory::format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(memory::format_bytes(int64_t{20} << 30), "20.00 GiB");
}

// A chain of 8 wide residual MLP blocks: y = x + W2 gelu(W1 x + b1) + b2, x of (T, D), hidden H.
// What autograd keeps per block when it is not checkpointed (fp32):
//   W1 x + b1 (the gelu input, T*H), gelu output (the W2 input, T*H), block output y (T*D; the next
//   block's W1 input). So a = 4*T*H bytes, s = 4*T*D bytes, per block 2a + s.
// Backward of the last block adds one T*H gradient before it frees the block's saved tensors,
// and parameter gradients (p bytes per block) accumulate as backward goes.
struct WideChain {
  static constexpr int64_t kBlocks = 8, T = 4096, D = 64, H = 1024;
  std::vector<torch::Tensor> w1, b1, w2, b2;
  WideChain() {
    for (int64_t i = 0; i < kBlocks; ++i) {
      w1.push_back((torch::randn({H, D}) * 0.05).requires_grad_());
      b1.push_back(torch::zeros({H}).requires_grad_());
      w2.push_back((torch::randn({D, H}) * 0.05).requires_grad_());
      b2.push_back(torch::zeros({D}).requires_grad_());
    }
  }
  Tensors block(int64_t i, const Tensors& s) const {
    auto h = torch::addmm(b1[i], s[0], w1[i].t());
    return {s[0] + torch::addmm(b2[i], torch::gelu(h, "tanh"), w2[i].t())};
  }
  static constexpr double a = 4.0 * T * H, s = 4.0 * T * D;
  static constexpr double p = 4.0 * (2 * H * D + H + D);

  // Segment size 0 = no checkpointing. Peak above the inputs and parameters, per the analysis:
  // - no checkpointing: every block's activations, plus the first backward step's gradients
  //   (one T*H and one T*D) and the last block's parameter gradients;
  // - segment size k: one kept boundary per segment (the last being the chain's output), plus
  //   the last segment's activations recomputed, its first backward step's gradients, and the
  //   parameter gradients of its k blocks. The first segment processed is the worst: later ones
  //   free more boundary bytes (s) than they add parameter gradients (p < s).
  static double analytical_peak(int64_t k) {
    if (k == 0) return kBlocks * (2 * a + s) + a + s + p;
    const double segments = static_cast<double>((kBlocks + k - 1) / k);
    return segments * s + k * (2 * a + s) + a + s + k * p;
  }
};

int64_t measured_peak(const WideChain& chain, const torch::Tensor& x, int64_t segment_size) {
  for (auto* group : {&chain.w1, &chain.b1, &chain.w2, &chain.b2}) {
    for (auto& t : *group) t.mutable_grad().reset();
  }
  memory::PeakScope scope;
  {
    const RunBlock run = [&](int64_t i, const Tensors& st) { return chain.block(i, st); };
    Tensors out{x};
    if (segment_size == 0) {
      for (int64_t i = 0; i < WideChain::kBlocks; ++i) out = run(i, out);
    } else {
      out = checkpoint_sequential_state(WideChain::kBlocks, segment_size, out, run);
    }
    out[0].sum().backward();
  }
  return scope.peak_delta();
}

TEST(CheckpointMemory, ForwardKeepsOnlySegmentBoundaries) {
  torch::manual_seed(0);
  WideChain chain;
  auto x = torch::randn({WideChain::T, WideChain::D}).requires_grad_();
  const int64_t off = measured_peak(chain, x, 0);
  const int64_t seg1 = measured_peak(chain, x, 1);
  const int64_t seg2 = measured_peak(chain, x, 2);
  const int64_t seg4 = measured_peak(chain, x, 4);
  for (auto [k, measured] : {std::pair<int64_t, int64_t>{0, off}, {1, seg1}, {2, seg2}, {4, seg4}}) {
    const double predicted = WideChain::analytical_peak(k);
    const double error = std::abs(measured - predicted) / predicted;
    std::printf("segment %lld: measured %s, analytical %s (%.1f%%)\n", static_cast<long long>(k),
                memory::format_bytes(measured).c_str(),
                memory::format_bytes(static_cast<int64_t>(predicted)).c_str(), 100 * error);
    EXPECT_LT(error, 0.10) << "segment size " << k;
  }
  EXPECT_LT(2 * seg1, off) << "per-block checkpointing must more than halve the peak";
  EXPECT_LT(seg1, seg4);
}

}  // namespace memory_test
}  // namespace
}  // namespace remat
