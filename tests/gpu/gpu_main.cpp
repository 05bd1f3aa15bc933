// main() of the GPU suite: the same set-up as every suite (tests/test_main.cpp), and where this
// process sees no CUDA device (every CPU machine, and a CPU build) the suite does not run: one
// line names each test that was not run and the exit code is 77, which CTest reports as "Not
// Run" (SKIP_RETURN_CODE), never as passed.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "remat/memory.h"

int main(int argc, char** argv) {
  remat::memory::install_cpu_tracking();
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  if (!torch::cuda::is_available()) {
    std::string names;
    const auto& unit = *::testing::UnitTest::GetInstance();
    int count = 0;
    for (int s = 0; s < unit.total_test_suite_count(); ++s) {
      const auto& suite = *unit.GetTestSuite(s);
      for (int t = 0; t < suite.total_test_count(); ++t) {
        names += (count++ ? ", " : "") + std::string(suite.name()) + "." + suite.GetTestInfo(t)->name();
      }
    }
    std::cout << "gpu_tests: " << count << " tests not run (no CUDA device): " << names << std::endl;
    return 77;
  }
  return RUN_ALL_TESTS();
}
