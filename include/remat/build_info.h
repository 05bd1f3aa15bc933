#pragma once
/// \file
/// What this build of remat was compiled against and what it can do, for `remat --version`, bug
/// reports and benchmark records.

#include <string>

#include "remat/export.h"

namespace remat {

struct BuildInfo {
  std::string remat_version;     ///< "0.1.0"
  std::string libtorch_version;  ///< TORCH_VERSION of the LibTorch compiled against: "1.13.1", "2.11.0"
  /// Compiled with CUDA (REMAT_WITH_CUDA: a CUDA LibTorch was found). The three versions below
  /// are those LibTorch was built with; empty in a CPU build.
  bool cuda_build = false;
  std::string cuda_version;   ///< CUDA runtime: "13.0"
  std::string cudnn_version;  ///< "9.19.0"
  std::string nccl_version;   ///< "2.28.9"
  int cuda_devices = 0;       ///< CUDA devices this process sees now (0 in a CPU build)
  bool float8 = false;        ///< float8 dtypes (fp8 base weights): LibTorch 2.1+
  bool fused_attention = false;  ///< at::scaled_dot_product_attention: LibTorch 2.1+
};

/// The figures of this build and machine. Never throws; asks no GPU for anything but its count.
REMAT_API BuildInfo build_info();

/// Three lines for people: remat's version; LibTorch's with CUDA, cuDNN and NCCL (or "CPU build");
/// the capabilities that differ between builds.
REMAT_API std::string describe(const BuildInfo& info);

}  // namespace remat
