// CUDA caching-allocator statistics: the only remat code that needs CUDA headers.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include "detail/cuda_memory.h"

namespace remat::memory::detail {
namespace {
// Index 0 of each stat array is the aggregate over pool types in every LibTorch version.
constexpr size_t kAggregate = 0;

c10::DeviceIndex resolve(int device_index) {
  TORCH_CHECK_VALUE(c10::cuda::device_count() > 0,
                    "[memory] CUDA statistics need a CUDA device, and this process sees none");
  return device_index < 0 ? c10::cuda::current_device() : static_cast<c10::DeviceIndex>(device_index);
}
}  // namespace

int64_t cuda_current_bytes(int device_index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(resolve(device_index));
  return stats.allocated_bytes[kAggregate].current;
}

int64_t cuda_peak_bytes(int device_index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(resolve(device_index));
  return stats.allocated_bytes[kAggregate].peak;
}

void cuda_reset_peak_all() {
  const auto count = c10::cuda::device_count();
  for (c10::DeviceIndex i = 0; i < count; ++i) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(i);
  }
}

int64_t cuda_available_bytes(int device_index) {
  const c10::DeviceIndex index = resolve(device_index);
  c10::cuda::CUDAGuard guard(index);
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  return static_cast<int64_t>(free) + stats.reserved_bytes[kAggregate].current;
}

}  // namespace remat::memory::detail
