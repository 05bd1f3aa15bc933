// remat::WeightStream: tensors keep their identity and values while their storage moves between
// host copies and a tracked ring; the ring is all a device would hold.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/memory.h"
#include "remat/weight_stream.h"
#include "value_error.h"

namespace remat {
namespace {
namespace weight_stream_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using testing::error_of;

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

struct Units {
  std::vector<std::vector<at::Tensor>> tensors;  // handed to the stream
  std::vector<std::vector<at::Tensor>> values;   // independent copies of the values
  int64_t bytes = 0;
};

// Four units of mixed dtypes and shapes, the third the largest.
Units make_units() {
  torch::manual_seed(7);
  Units u;
  const std::vector<std::vector<at::Tensor>> made = {
      {torch::randn({8, 6}), torch::randn({6})},
      {torch::randn({5, 7}).to(at::kBFloat16), torch::randint(-100, 100, {9}, at::kChar)},
      {torch::randn({16, 12}, at::kDouble), torch::randn({3})},
      {at::empty_strided({4, 4}, {1, 4}).normal_(), torch::randint(0, 255, {10}, at::kByte)},  // not contiguous
  };
  for (const auto& unit : made) {
    u.tensors.push_back(unit);
    std::vector<at::Tensor> copies;
    for (const auto& t : unit) {
      copies.push_back(t.clone());
      u.bytes += bytes_of(t);
    }
    u.values.push_back(copies);
  }
  return u;
}

void expect_values(const Units& u, size_t unit, const std::string& when) {
  for (size_t i = 0; i < u.tensors[unit].size(); ++i) {
    EXPECT_TRUE(torch::equal(u.tensors[unit][i], u.values[unit][i])) << when << ": unit " << unit << " tensor " << i;
  }
}

TEST(WeightStreamTest, TrackedBytesAreTheRingAndValuesNeverChange) {
  ASSERT_TRUE(memory::cpu_tracking_installed());
  Units u = make_units();
  const int64_t before = memory::current_bytes();
  {
    WeightStream stream(u.tensors, at::kCPU, 2);
    const WeightStreamStats s = stream.stats();
    EXPECT_EQ(s.units, 4);
    EXPECT_EQ(s.host_bytes, u.bytes);
    // The largest unit: 16 x 12 doubles (1536 bytes) and 3 floats, each at a 256-byte boundary.
    EXPECT_EQ(s.slot_bytes, 1536 + 256);
    EXPECT_EQ(s.device_bytes, 2 * s.slot_bytes);
    // The units' own storage is gone from the tracked (device) bytes, the ring came in.
    EXPECT_EQ(memory::current_bytes() - before, s.device_bytes - u.bytes);
    for (size_t k = 0; k < 4; ++k) expect_values(u, k, "on the host");

    for (int64_t k = 0; k < 4; ++k) {
      stream.use(k);
      EXPECT_TRUE(stream.resident(k));
      if (k > 0) {
        EXPECT_FALSE(stream.resident(k - 1)) << "a unit of another group is released";
      }
      for (size_t j = 0; j < 4; ++j) expect_values(u, j, "after use(" + std::to_string(k) + ")");
    }
    // The forward order: each unit copied once (prefetched by the use before it).
    EXPECT_EQ(stream.stats().copies, 4);
    EXPECT_EQ(stream.stats().bytes_copied, u.bytes);
    stream.release_all();
    EXPECT_FALSE(stream.resident(3));
    EXPECT_EQ(memory::current_bytes() - before, s.device_bytes - u.bytes);
  }
  // Destroyed: every tensor back in tracked memory of its own (as before), values unchanged.
  EXPECT_EQ(memory::current_bytes(), before);
  for (size_t k = 0; k < 4; ++k) expect_values(u, k, "after the stream");
}

TEST(WeightStreamTest, AGroupStaysResidentTogether) {
  Units u = make_units();
  WeightStream stream(u.tensors, at::kCPU, 3);
  stream.set_groups({0, 0, 1, 1});
  stream.use(0);
  stream.use(1);
  EXPECT_TRUE(stream.resident(0));
  EXPECT_TRUE(stream.resident(1));
  stream.use(2);
  EXPECT_FALSE(stream.resident(0));
  EXPECT_FALSE(stream.resident(1));
  stream.use(3);
  EXPECT_TRUE(stream.resident(2));
  for (size_t k = 0; k < 4; ++k) expect_values(u, k, "grouped");
  EXPECT_EQ(WeightStream::slots_for_groups({0, 0, 1, 1}), 3);
  EXPECT_EQ(WeightStream::slots_for_groups({0, 1, 1, 1}), 4);
}

// A trained tensor streams both ways: autograd's gradient of the slot's weights goes to the host
// when its unit is released (outside the tracked bytes, as a GPU would not hold it), a host
// gradient waits aside while the unit is in use and the next one is added to it (accumulation).
TEST(WeightStreamTest, TrainedTensorsStreamTheirGradientsBack) {
  at::Tensor w0 = torch::randn({256}).requires_grad_(true), w1 = torch::randn({256}).requires_grad_(true);
  const at::Tensor w0_values = w0.detach().clone();
  WeightStream stream({{w0}, {w1}}, at::kCPU, 2);
  EXPECT_EQ(stream.stats().trained_tensors, 2);
  for (int pass = 1; pass <= 2; ++pass) {
    stream.use(0);
    EXPECT_FALSE(w0.grad().defined()) << "pass " << pass << ": the host gradient waits aside while in use";
    (w0 * w0).sum().backward();  // d/dw0 = 2 w0
    const int64_t tracked = memory::current_bytes();
    stream.use(1);  // another group: unit 0 is released and its gradient goes to the host
    EXPECT_EQ(memory::current_bytes(), tracked - 256 * 4) << "pass " << pass << ": the slot's gradient left the tracked bytes";
    ASSERT_TRUE(w0.grad().defined());
    EXPECT_TRUE(torch::equal(w0.grad(), w0_values * 2 * pass)) << "pass " << pass;
    EXPECT_EQ(stream.stats().gradient_bytes_returned, pass * 256 * 4);
  }
  EXPECT_FALSE(w1.grad().defined());
  EXPECT_TRUE(torch::equal(w0.detach(), w0_values));
}

TEST(WeightStreamTest, BadUseIsAClearError) {
  Units u = make_units();
  EXPECT_NE(error_of([&] { WeightStream(u.tensors, at::kCPU, 1); }).find("ring_slots must be at least 2 (one in use, one being filled), got 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { WeightStream({}, at::kCPU, 2); }).find("no units"), std::string::npos);
  WeightStream stream(u.tensors, at::kCPU, 2);
  EXPECT_NE(error_of([&] { stream.set_groups({0, 0, 1, 1}); }).find("needs 3 ring slots, the stream has 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { stream.set_groups({1, 0, 2, 3}); }).find("unit 1 has group 0 after 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { stream.set_groups({0, 1}); }).find("2 groups for 4 units"), std::string::npos);
}

TEST(WeightStreamTest, UntrackedHostMemoryIsNotCounted) {
  const int64_t before = memory::current_bytes();
  at::Tensor host = untracked_host_empty({1024, 16}, at::kFloat);
  EXPECT_EQ(memory::current_bytes(), before);
  host.fill_(2.0f);
  EXPECT_EQ(host.sum().item<float>(), 2.0f * 1024 * 16);
  EXPECT_TRUE(host.is_contiguous());
}

}  // namespace weight_stream_test
}  // namespace
}  // namespace remat
