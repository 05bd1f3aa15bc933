// Shared main() of every test suite: fixes the thread count (LibTorch may default to 1 here, and
// an unset count makes timings and reductions vary between machines) and installs the
// peak-tracking CPU allocator before any tensor exists, so memory tests see every allocation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/memory.h"

int main(int argc, char** argv) {
  remat::memory::install_cpu_tracking();
  torch::set_num_threads(2);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
