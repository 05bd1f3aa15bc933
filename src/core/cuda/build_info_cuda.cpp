// The CUDA-side figures of remat::build_info(): what LibTorch's CUDA library was compiled with
// (ATen's CUDA hooks: CUDART_VERSION and CUDNN_VERSION; torch::cuda::nccl::version(), which asks
// the NCCL library loaded) and the devices visible now.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/nccl.h>

#include <exception>

#include "detail/cuda_versions.h"

namespace remat::detail {
namespace {

// CUDNN_VERSION: major * 10000 + minor * 100 + patch (cuDNN 9).
std::string dotted_cudnn(long version) {
  return std::to_string(version / 10000) + "." + std::to_string(version % 10000 / 100) + "." +
         std::to_string(version % 100);
}

}  // namespace

CudaVersions cuda_versions() {
  CudaVersions versions;
  const auto& hooks = at::detail::getCUDAHooks();
  const long runtime = hooks.versionCUDART();  // CUDART_VERSION: major * 1000 + minor * 10
  versions.cuda = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
  try {
    versions.cudnn = hooks.hasCuDNN() ? dotted_cudnn(hooks.versionCuDNN()) : "none";
  } catch (const std::exception&) {
    versions.cudnn = "unknown";
  }
  try {
    const std::uint64_t nccl = torch::cuda::nccl::version();  // major << 32 | minor << 16 | patch
    versions.nccl = std::to_string(nccl >> 32) + "." + std::to_string((nccl >> 16) & 0xffff) + "." +
                    std::to_string(nccl & 0xffff);
  } catch (const std::exception&) {
    versions.nccl = "unknown";
  }
  versions.devices = static_cast<int>(c10::cuda::device_count());
  return versions;
}

}  // namespace remat::detail
