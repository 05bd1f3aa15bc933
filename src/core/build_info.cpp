#include "remat/build_info.h"

#include <torch/version.h>

#include "detail/cuda_versions.h"
#include "remat/compat.h"

namespace remat {

BuildInfo build_info() {
  BuildInfo info;
  info.remat_version = REMAT_VERSION;  // the project() version, from src/CMakeLists.txt
  info.libtorch_version = TORCH_VERSION;
#if defined(REMAT_WITH_CUDA)
  info.cuda_build = true;
#endif
  const detail::CudaVersions cuda = detail::cuda_versions();
  info.cuda_version = cuda.cuda;
  info.cudnn_version = cuda.cudnn;
  info.nccl_version = cuda.nccl;
  info.cuda_devices = cuda.devices;
  info.float8 = compat::kHasFloat8;
  info.fused_attention = compat::kHasScaledDotProductAttention;
  return info;
}

std::string describe(const BuildInfo& info) {
  std::string text = "remat " + info.remat_version + "\n";
  text += "LibTorch " + info.libtorch_version;
  if (info.cuda_build) {
    text += ", CUDA " + info.cuda_version + ", cuDNN " + info.cudnn_version + ", NCCL " + info.nccl_version +
            " (CUDA build; " + std::to_string(info.cuda_devices) + " CUDA device" +
            (info.cuda_devices == 1 ? "" : "s") + " visible)\n";
  } else {
    text += " (CPU build: no CUDA, cuDNN or NCCL)\n";
  }
  text += std::string("float8 base weights: ") + (info.float8 ? "yes" : "no (LibTorch 2.1+)") +
          "; attention: " +
          (info.fused_attention ? "at::scaled_dot_product_attention" : "the composite formula (LibTorch < 2.1)") + "\n";
  return text;
}

}  // namespace remat
