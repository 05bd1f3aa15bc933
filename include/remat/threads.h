#pragma once
/// \file
/// The CPU thread pools a run uses, set together. LibTorch's intra-op pool does not govern the BLAS
/// its matrix products call: Debian's LibTorch calls the system BLAS (OpenBLAS, a pthreads build),
/// which keeps its own pool, so `torch::set_num_threads(1)` alone still runs GEMMs on every core
/// and leaves OpenBLAS's idle threads spinning in sched_yield. `set_cpu_threads` sets both.

#include <string>

#include "remat/export.h"

namespace remat {

struct CpuThreads {
  int intra_op = 0;   ///< LibTorch's intra-op pool (at::get_num_threads() after the call)
  int blas = 0;       ///< the BLAS's own pool; 0 when no BLAS with a thread API is loaded
  std::string blas_name;  ///< "OpenBLAS", "BLIS" or "" (none found: the BLAS runs in the caller's thread,
                          ///< or is MKL, which LibTorch's own call already set)
};

/// Sets LibTorch's intra-op pool and the loaded BLAS's pool to `threads` (>= 1), or, for 0, to
/// LibTorch's default (the physical cores), so that the two never add up to more than the cores.
/// Throws c10::ValueError for a negative count. Returns what is set now.
REMAT_API CpuThreads set_cpu_threads(int64_t threads);

/// What is set now, without changing it.
REMAT_API CpuThreads cpu_threads();

/// "LibTorch intra-op 2, OpenBLAS 2" (or "..., BLAS in the calling thread").
REMAT_API std::string describe(const CpuThreads& threads);

}  // namespace remat
