#pragma once
/// \file
/// Peak-tracking memory accounting. Every claim remat makes about memory is measured here.
///
/// On CPU, `install_cpu_tracking` wraps LibTorch's CPU allocator so the bytes held by live CPU
/// tensors are counted exactly (storage sizes, as the allocator sees them). In CUDA builds the
/// CUDA figures come from the caching allocator's statistics (what
/// torch.cuda.max_memory_allocated reports).

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

#include "remat/export.h"

namespace remat::memory {

/// Installs the tracking CPU allocator. Idempotent and thread-safe. Tensors allocated before the
/// first call are not counted (their frees are not subtracted either). Call it first thing in
/// main().
REMAT_API void install_cpu_tracking();

/// Lets freed host memory be reused without holding more than the tensors ever needed at once.
/// glibc's malloc otherwise starts by mapping each block above 128 KiB on its own and trimming the
/// heap whenever 128 KiB lie free at its top, so an inference loop that allocates and frees the
/// same tens of MiB each step takes them back from the kernel page by page every step (about
/// 11,000 page faults a step for the sampling benchmark's transformer); and where it keeps them in
/// its heap, blocks of other sizes reuse them only in part, so the resident set grows past the
/// tensors' peak. After this call every CPU tensor of 1 MiB or more comes from anonymous mappings:
/// freed ones become free page ranges that later requests take whole or split, unmapped (oldest
/// first) as soon as live + kept would exceed the most the live ones ever took plus 4 MiB (Note
/// [Host blocks] in src/core/host_blocks.cpp); smaller ones stay in malloc's heap, which keeps up
/// to 64 MiB free at its top. Installs CPU tracking (the blocks are its allocations).
/// Returns whether it took effect: not when the user set glibc's malloc limits (GLIBC_TUNABLES
/// glibc.malloc.*, MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_), or off glibc. The CLI calls it
/// first thing; a library user decides for their own process.
REMAT_API bool reuse_freed_host_memory();

/// Hands every freed block kept for reuse back to the kernel (and malloc's free heap pages), and
/// forgets the peak that justified keeping them: for the end of a phase whose peak the next will
/// not reach (encoding a dataset's captions before training, say).
REMAT_API void release_cached_host_memory();

/// Whether install_cpu_tracking() has run.
REMAT_API bool cpu_tracking_installed();

/// Sets the peak to the current figure, on CPU and (CUDA builds) on every CUDA device.
REMAT_API void reset_peak();

/// Bytes held by live CPU tensors allocated since tracking was installed.
REMAT_API int64_t current_bytes();

/// Highest current_bytes() since the last reset_peak().
REMAT_API int64_t peak_bytes();

/// Current / peak allocated bytes on `device`: the tracked CPU figures for CPU, the caching
/// allocator's figures for CUDA. Throws for a CUDA device in a build without CUDA support.
REMAT_API int64_t current_bytes(c10::Device device);
REMAT_API int64_t peak_bytes(c10::Device device);

/// Bytes a training step could have live at its peak on `device`, for a default memory budget:
/// on CPU the tracked bytes now plus the machine's MemAvailable (/proc/meminfo; where that file
/// is missing, the tracked bytes alone), on CUDA the driver's free memory plus what the caching
/// allocator reserves. Throws for a CUDA device in a build without CUDA support.
REMAT_API int64_t available_bytes(c10::Device device);

/// Whether this build reads CUDA allocator statistics (REMAT_WITH_CUDA).
REMAT_API bool cuda_statistics_available();

/// RAII: resets the peak on construction; `peak_delta()` is the peak above the bytes live at that
/// moment. Measures what one region of code adds.
class REMAT_API PeakScope {
 public:
  explicit PeakScope(c10::Device device = c10::Device(c10::kCPU));
  int64_t baseline_bytes() const { return baseline_; }
  int64_t peak_bytes() const;
  int64_t peak_delta() const { return peak_bytes() - baseline_; }

 private:
  c10::Device device_;
  int64_t baseline_;
};

/// Formats a byte count for people: "512 B", "1.50 KiB", "20.00 GiB".
REMAT_API std::string format_bytes(int64_t bytes);

}  // namespace remat::memory
