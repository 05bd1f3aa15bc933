// Tensors read from user files (remat/io/safetensors.h) are checked to be finite before use.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "remat/io/safetensors.h"
#include "value_error.h"

namespace {
namespace finite_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

TEST(RequireFinite, NamesTheTensorTheCountAndTheFirstIndex) {
  at::Tensor t = torch::zeros({3, 4});
  remat::io::require_finite(t, "lora", "f.safetensors", "w");  // finite: nothing
  t[1][2] = std::numeric_limits<float>::quiet_NaN();
  t[2][3] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(remat::testing::error_text([&] { remat::io::require_finite(t, "lora", "f.safetensors", "w"); }),
            "[lora] 'f.safetensors': tensor 'w' holds 2 non-finite value(s) (NaN or inf), the first at flat index 6; "
            "a NaN turns everything computed from it NaN: use a finite file");
  EXPECT_NE(remat::testing::error_text(
                [&] { remat::io::require_finite(t.to(at::kBFloat16), "checkpoint", "c.safetensors", "w"); })
                .find("holds 2 non-finite"),
            std::string::npos);
  remat::io::require_finite(torch::full({2}, 7, at::kLong), "x", "y", "z");  // integers are always finite
}

}  // namespace finite_test
}  // namespace
