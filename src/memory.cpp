// Peak-tracking CPU allocator: wraps the allocator LibTorch registered for CPU and counts the
// bytes of every allocation it hands out until that allocation's deleter runs.
#include "remat/memory.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include "detail/cuda_memory.h"

namespace remat::memory {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};

void raise_peak_to(int64_t value) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (value > peak && !g_peak.compare_exchange_weak(peak, value, std::memory_order_relaxed)) {
  }
}

// What our deleter needs: the wrapped allocation (freed through its own deleter) and its size.
struct TrackedAllocation {
  c10::DataPtr inner;
  int64_t bytes;
};

void delete_tracked(void* context) {
  auto* allocation = static_cast<TrackedAllocation*>(context);
  g_current.fetch_sub(allocation->bytes, std::memory_order_relaxed);
  delete allocation;  // frees `inner` through the wrapped allocator's deleter
}

class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t nbytes) const override {
    c10::DataPtr inner = inner_->allocate(nbytes);
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* allocation = new TrackedAllocation{std::move(inner), static_cast<int64_t>(nbytes)};
    const int64_t now = g_current.fetch_add(allocation->bytes, std::memory_order_relaxed) +
                        allocation->bytes;
    raise_peak_to(now);
    return {data, allocation, &delete_tracked, device};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    // Tensors made from raw pointers (at::from_blob) do not come through here; there is no raw
    // deleter because each allocation carries its own context.
    return nullptr;
  }

 private:
  c10::Allocator* inner_;
};

std::once_flag g_install_once;
std::atomic<bool> g_installed{false};

}  // namespace

void install_cpu_tracking() {
  std::call_once(g_install_once, [] {
    // Leaked on purpose: tensors freed during static destruction still call into it.
    static auto* tracking = new TrackingAllocator(c10::GetAllocator(c10::DeviceType::CPU));
    // Priority above LibTorch's own registration (0) so it wins over the default.
    c10::SetAllocator(c10::DeviceType::CPU, tracking, /*priority=*/1);
    g_installed = true;
  });
}

bool cpu_tracking_installed() { return g_installed.load(); }

void reset_peak() {
  g_peak.store(g_current.load(std::memory_order_relaxed), std::memory_order_relaxed);
  detail::cuda_reset_peak_all();
}

int64_t current_bytes() { return g_current.load(std::memory_order_relaxed); }

int64_t peak_bytes() {
  return std::max(g_peak.load(std::memory_order_relaxed), g_current.load(std::memory_order_relaxed));
}

int64_t current_bytes(c10::Device device) {
  if (device.is_cpu()) return current_bytes();
  TORCH_CHECK_VALUE(device.is_cuda(), "[memory] no statistics for device ", device,
                    " (valid: cpu, cuda)");
  return detail::cuda_current_bytes(device.index());
}

int64_t peak_bytes(c10::Device device) {
  if (device.is_cpu()) return peak_bytes();
  TORCH_CHECK_VALUE(device.is_cuda(), "[memory] no statistics for device ", device,
                    " (valid: cpu, cuda)");
  return detail::cuda_peak_bytes(device.index());
}

bool cuda_statistics_available() { return detail::kCudaStatistics; }

PeakScope::PeakScope(c10::Device device) : device_(device) {
  reset_peak();
  baseline_ = current_bytes(device_);
}

int64_t PeakScope::peak_bytes() const { return memory::peak_bytes(device_); }

std::string format_bytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(text, sizeof(text), "%.2f %s", value, kUnits[unit]);
  }
  return text;
}

}  // namespace remat::memory
