// Shared main() of every test suite: fixes the thread count (an unset count makes reductions
// vary between machines) and installs the peak-tracking CPU allocator before any tensor exists,
// so memory tests see every allocation. One LibTorch thread: OpenBLAS already runs the matmuls
// on every core with its own threads, and a second OpenMP pool spinning beside them made steps
// up to 3x slower on the 2-core CI machine (docs/PERFORMANCE.md, "Threads").
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/memory.h"

int main(int argc, char** argv) {
  remat::memory::install_cpu_tracking();
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
