// set_cpu_threads governs every pool a step uses: LibTorch's and the BLAS's own (OpenBLAS on
// Debian), so one thread means one core busy, measured as process CPU time over wall time.
#include <ctime>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/threads.h"
#include "value_error.h"

namespace {
namespace threads_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

double seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Restores the thread counts a test changed, so the others in this process see the defaults.
class CpuThreadsTest : public ::testing::Test {
 protected:
  void TearDown() override { remat::set_cpu_threads(saved_.intra_op); }
  remat::CpuThreads saved_ = remat::cpu_threads();
};

TEST_F(CpuThreadsTest, OneThreadSetsEveryPoolItFinds) {
  const remat::CpuThreads t = remat::set_cpu_threads(1);
  EXPECT_EQ(t.intra_op, 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  if (!t.blas_name.empty()) {
    EXPECT_EQ(t.blas, 1) << t.blas_name;
  }
  EXPECT_NE(remat::describe(t).find("LibTorch intra-op 1"), std::string::npos) << remat::describe(t);
}

TEST_F(CpuThreadsTest, ZeroGivesTheBlasLibTorchsCount) {
  const remat::CpuThreads t = remat::set_cpu_threads(0);
  EXPECT_EQ(t.intra_op, at::get_num_threads());
  if (!t.blas_name.empty()) {
    EXPECT_EQ(t.blas, t.intra_op) << t.blas_name;
  }
}

// The work of a step: matrix products (the BLAS) and element-wise kernels (LibTorch's pool).
TEST_F(CpuThreadsTest, OneThreadKeepsOneCoreBusy) {
  remat::set_cpu_threads(1);
  torch::manual_seed(0);
  const at::Tensor a = torch::randn({384, 384}), b = torch::randn({384, 384});
  const double wall0 = seconds(CLOCK_MONOTONIC), cpu0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
  at::Tensor c = a;
  for (int i = 0; i < 60; ++i) c = at::gelu(at::matmul(c, b)).div_(c.abs().max().clamp_min(1.0));
  const double wall = seconds(CLOCK_MONOTONIC) - wall0, cpu = seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
  ASSERT_TRUE(c.isfinite().all().item<bool>());
  ASSERT_GT(wall, 0.0);
  // A second busy thread would put the ratio near 2; one thread keeps it at or under 1 (plus
  // the clocks' granularity).
  EXPECT_LT(cpu / wall, 1.15) << "CPU time " << cpu << " s over " << wall << " s wall";
}

TEST_F(CpuThreadsTest, NegativeCountIsRefusedByValue) {
  const std::string message = remat::testing::error_of([] { remat::set_cpu_threads(-3); });
  EXPECT_NE(message.find("got -3"), std::string::npos) << message;
}

}  // namespace threads_test
}  // namespace
