// Allocation failures named (remat/out_of_memory.h): the size is read from LibTorch's own
// allocator error, and the failure becomes remat's [memory] error naming the work.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <new>
#include <stdexcept>

#include "remat/out_of_memory.h"
#include "value_error.h"

namespace {
namespace out_of_memory_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

// A real allocation the CPU allocator refuses: 2^62 bytes is more than any machine maps.
at::Tensor impossible_tensor() { return at::empty({int64_t{1} << 60}, at::kFloat); }

TEST(OutOfMemory, ReadsTheSizeFromTheAllocatorsError) {
  try {
    impossible_tensor();
    FAIL() << "a 2^62-byte tensor was allocated";
  } catch (const c10::Error& e) {
    const auto bytes = remat::memory::failed_allocation_bytes(e);
    ASSERT_TRUE(bytes.has_value()) << e.what_without_backtrace();
    // The request, plus whatever header the allocator in use adds (remat's tracking adds one).
    EXPECT_GE(*bytes, int64_t{1} << 62);
    EXPECT_LE(*bytes, (int64_t{1} << 62) + 4096);
  }
  EXPECT_EQ(remat::memory::failed_allocation_bytes(std::bad_alloc()), 0);
  EXPECT_FALSE(remat::memory::failed_allocation_bytes(std::runtime_error("not memory")).has_value());
  const c10::Error cuda(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79 GiB");
  EXPECT_EQ(remat::memory::failed_allocation_bytes(cuda), 20 * 1024 * 1024);
}

TEST(OutOfMemory, TheMessageNamesTheWorkTheSizeAndTheWayOut) {
  const std::string message = remat::testing::error_text([] {
    try {
      impossible_tensor();
    } catch (const c10::Error& e) {
      const auto bytes = remat::memory::failed_allocation_bytes(e);
      ASSERT_TRUE(bytes.has_value());
      remat::memory::throw_out_of_memory("encoding a 4096 x 4096 picture", "lower the resolution", *bytes);
    }
  });
  EXPECT_EQ(message.rfind("[memory] encoding a 4096 x 4096 picture ran out of memory: one allocation of ", 0), 0u)
      << message;
  EXPECT_NE(message.find("(46116860184273879"), std::string::npos) << message;  // 2^62 and a header
  EXPECT_NE(message.find(" bytes) failed; this machine has "), std::string::npos) << message;
  EXPECT_NE(message.find(" available: lower the resolution"), std::string::npos) << message;
  EXPECT_EQ(remat::memory::out_of_memory_message("x", "", 0).rfind("[memory] x ran out of memory: an allocation failed; "
                                                                   "this machine has ", 0),
            0u);
}

}  // namespace out_of_memory_test
}  // namespace
