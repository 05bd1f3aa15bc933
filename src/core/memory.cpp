// Peak-tracking CPU allocator: wraps the allocator LibTorch registered for CPU and counts the
// bytes of every allocation it hands out until that allocation's deleter runs.
#include "remat/memory.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include "detail/cuda_memory.h"
#include "detail/host_blocks.h"

namespace remat::memory {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};

void raise_peak_to(int64_t value) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (value > peak && !g_peak.compare_exchange_weak(peak, value, std::memory_order_relaxed)) {
  }
}

// Some LibTorch code (Allocator::raw_allocate, used by MKL-DNN among others) requires that a CPU
// allocation's context is its data pointer. So the size of each allocation lives in a header just
// before the data: the wrapped allocator hands out `kHeader + nbytes`, we return base + kHeader
// (still 64-byte aligned) with ourselves as raw deleter, and the deleter steps back to the header.
constexpr size_t kHeader = 64;

struct Header {
  int64_t bytes;
  size_t mapped;  // a block of its own (Note [Host blocks]) of this size; 0: from the wrapped allocator
};

c10::DeleterFnPtr g_inner_deleter = nullptr;
std::atomic<bool> g_host_blocks{false};

void delete_tracked(void* data) {
  if (data == nullptr) return;
  void* base = static_cast<char*>(data) - kHeader;
  const Header header = *static_cast<Header*>(base);
  g_current.fetch_sub(header.bytes, std::memory_order_relaxed);
  if (header.mapped != 0) {
    detail::host_block_release(base, header.mapped);
  } else {
    g_inner_deleter(base);
  }
}

class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* inner) : inner_(inner) {}

  // LibTorch 1.13 declares `allocate` const; 2.x made it non-const and added `copy_data`. Both
  // forms are defined without `override`: on each version one of them overrides the base and
  // the other is an ordinary member function.
  c10::DataPtr allocate(size_t nbytes) { return allocate_tracked(nbytes); }
  c10::DataPtr allocate(size_t nbytes) const { return allocate_tracked(nbytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_tracked; }

 private:
  c10::DataPtr allocate_tracked(size_t nbytes) const {
    size_t mapped = 0;
    void* base = g_host_blocks.load(std::memory_order_relaxed) && nbytes + kHeader >= detail::kHostBlockFrom
                     ? detail::host_block_allocate(nbytes + kHeader, &mapped)
                     : inner_->raw_allocate(nbytes + kHeader);
    *static_cast<Header*>(base) = Header{static_cast<int64_t>(nbytes), mapped};
    const int64_t now =
        g_current.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) +
        static_cast<int64_t>(nbytes);
    raise_peak_to(now);
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &delete_tracked, c10::Device(c10::DeviceType::CPU)};
  }

  c10::Allocator* inner_;
};

std::once_flag g_install_once;
std::atomic<bool> g_installed{false};

}  // namespace

bool reuse_freed_host_memory() {
#if defined(__GLIBC__)
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if ((tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) ||
      std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr || std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) {
    return false;  // the user's own setting wins
  }
  install_cpu_tracking();
  if (!g_installed.load()) return false;
  g_host_blocks = true;
  // Tensors from kHostBlockFrom on are host blocks; what stays in malloc's heap is smaller, and
  // up to 64 MiB of it is kept free at the heap's top rather than trimmed at every free (the
  // limit glibc pairs with its largest dynamic mmap threshold).
  constexpr int kKeepFreeAtTop = 64 << 20;
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(detail::kHostBlockFrom)) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kKeepFreeAtTop) == 1;
#else
  return false;
#endif
}

void release_cached_host_memory() {
  detail::host_block_drop_cache();
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

void install_cpu_tracking() {
  std::call_once(g_install_once, [] {
    c10::Allocator* inner = c10::GetAllocator(c10::DeviceType::CPU);
    // The header scheme needs an allocator whose allocations free through one raw deleter; the
    // CPU allocator of every LibTorch release is one. Without it, tracking stays off.
    g_inner_deleter = inner->raw_deleter();
    if (g_inner_deleter == nullptr) return;
    // Leaked on purpose: tensors freed during static destruction still call into it.
    static auto* tracking = new TrackingAllocator(inner);
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

int64_t available_bytes(c10::Device device) {
  if (!device.is_cpu()) return detail::cuda_available_bytes(device.has_index() ? device.index() : -1);
  // "MemAvailable:   12345678 kB": what the kernel can give without swapping.
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  int64_t available_kib = 0;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream(line.substr(13)) >> available_kib;
    break;
  }
  return current_bytes() + available_kib * 1024;
}

}  // namespace remat::memory
