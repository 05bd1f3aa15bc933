// remat_pytrack: remat's peak-tracking CPU allocator behind a C ABI, for Python (ctypes).
//
// Python's torch loads the same libc10.so as remat, so installing remat's tracking allocator from
// inside a Python process makes that process's CPU tensor allocations counted by exactly the same
// code that counts remat's: the peaks bench/flux_eager.py reports compare like with like with
// `remat bench`. Load it and call remat_install_cpu_tracking() before creating any tensor whose
// bytes should count (allocations made before are neither counted nor subtracted when freed).
#include <cstdint>

#include "remat/memory.h"

// The project builds with hidden visibility; these four are the library's whole interface.
#define REMAT_PYTRACK_API extern "C" __attribute__((visibility("default")))

/// Installs remat's tracking CPU allocator in this process (idempotent). Returns 1 when tracking
/// is active afterwards, 0 when LibTorch's CPU allocator could not be wrapped.
REMAT_PYTRACK_API int remat_install_cpu_tracking() {
  remat::memory::install_cpu_tracking();
  return remat::memory::cpu_tracking_installed() ? 1 : 0;
}

/// Sets the peak to the bytes currently held by live CPU tensors.
REMAT_PYTRACK_API void remat_reset_peak() { remat::memory::reset_peak(); }

/// Bytes held by live CPU tensors allocated since tracking was installed.
REMAT_PYTRACK_API int64_t remat_current_bytes() { return remat::memory::current_bytes(); }

/// Highest remat_current_bytes() since the last remat_reset_peak().
REMAT_PYTRACK_API int64_t remat_peak_bytes() { return remat::memory::peak_bytes(); }
