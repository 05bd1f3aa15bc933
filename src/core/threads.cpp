// The BLAS's pool is found at run time: whichever BLAS LibTorch was linked with (Debian: the
// libblas.so.3 alternative, normally OpenBLAS; PyPI: MKL inside libtorch_cpu) is already in the
// process, so its thread API is looked up by name rather than linked against.

#include "remat/threads.h"

#include <dlfcn.h>

#include <ATen/Parallel.h>

#include "remat/util/error.h"

namespace remat {
namespace {

using SetThreads = void (*)(int);
using GetThreads = int (*)();

struct BlasThreadApi {
  const char* name;
  SetThreads set;
  GetThreads get;
};

// OpenBLAS (interface/openblas_set_num_threads.c; driver/others/blas_server.c) and BLIS
// (frame/thread/bli_thread.c). MKL needs nothing: at::set_num_threads calls mkl_set_num_threads.
BlasThreadApi find_blas() {
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    return {"OpenBLAS", set, reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))};
  }
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "bli_thread_set_num_threads"))) {
    return {"BLIS", set, reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "bli_thread_get_num_threads"))};
  }
  return {"", nullptr, nullptr};
}

}  // namespace

CpuThreads cpu_threads() {
  CpuThreads t;
  t.intra_op = at::get_num_threads();
  const BlasThreadApi blas = find_blas();
  if (blas.set != nullptr && blas.get != nullptr) {
    t.blas_name = blas.name;
    t.blas = blas.get();
  }
  return t;
}

CpuThreads set_cpu_threads(int64_t threads) {
  if (threads < 0) {
    throw_value_error("[threads] the thread count must be >= 1, or 0 for one per physical core, got " +
                      std::to_string(threads));
  }
  if (threads > 0) at::set_num_threads(static_cast<int>(threads));
  // 0 keeps LibTorch's pool as it is (its default: one thread per physical core) and gives the
  // BLAS the same count, so a GEMM never runs on more threads than the rest of the step.
  const int count = at::get_num_threads();
  const BlasThreadApi blas = find_blas();
  if (blas.set != nullptr) blas.set(count);
  return cpu_threads();
}

std::string describe(const CpuThreads& t) {
  std::string text = "LibTorch intra-op " + std::to_string(t.intra_op) + ", ";
  if (!t.blas_name.empty()) return text + t.blas_name + " " + std::to_string(t.blas);
  return text + "BLAS in the calling thread or governed by LibTorch (MKL)";
}

}  // namespace remat
