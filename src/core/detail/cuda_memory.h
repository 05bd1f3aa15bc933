#pragma once
// CUDA caching-allocator statistics. Implemented in src/core/cuda/memory_cuda.cpp in CUDA builds
// (REMAT_WITH_CUDA); elsewhere these are stubs: there is no CUDA device to report on.

#include <cstdint>

#include <c10/util/Exception.h>

namespace remat::memory::detail {

#if defined(REMAT_WITH_CUDA)
inline constexpr bool kCudaStatistics = true;
int64_t cuda_current_bytes(int device_index);
int64_t cuda_peak_bytes(int device_index);
void cuda_reset_peak_all();
/// Free device memory (driver) plus what the caching allocator holds (reserved).
int64_t cuda_available_bytes(int device_index);
#else
inline constexpr bool kCudaStatistics = false;
inline int64_t cuda_current_bytes(int) {
  TORCH_CHECK(false, "[memory] CUDA statistics need a CUDA build of remat (REMAT_WITH_CUDA=ON)");
}
inline int64_t cuda_peak_bytes(int index) { return cuda_current_bytes(index); }
inline void cuda_reset_peak_all() {}
inline int64_t cuda_available_bytes(int index) { return cuda_current_bytes(index); }
#endif

}  // namespace remat::memory::detail
