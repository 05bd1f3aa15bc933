#pragma once
// The CUDA, cuDNN and NCCL versions LibTorch was built with. Implemented in
// src/core/cuda/build_info_cuda.cpp in CUDA builds (REMAT_WITH_CUDA); elsewhere there are none.

#include <string>

namespace remat::detail {

struct CudaVersions {
  std::string cuda, cudnn, nccl;
  int devices = 0;
};

#if defined(REMAT_WITH_CUDA)
CudaVersions cuda_versions();
#else
inline CudaVersions cuda_versions() { return {}; }
#endif

}  // namespace remat::detail
