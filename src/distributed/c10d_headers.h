#pragma once
// c10d's headers, in one place: they need USE_C10D_GLOO (set by src/CMakeLists.txt for this
// layer) and, on Debian's LibTorch, the include shim in shim/ (see its comment). Only this
// layer's sources include them; remat's public headers never do.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "remat/compat.h"

namespace remat::distributed::compat {

// PyTorch 2.0 made ProcessGroupGloo a c10d::Backend that a c10d::ProcessGroup holds per device
// type; the Reducer still takes a ProcessGroup. 1.13's ProcessGroupGloo is itself the
// ProcessGroup. This turns a backend into what the Reducer takes, on both.
template <typename BackendImpl>
c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int size, c10::intrusive_ptr<BackendImpl> backend,
                                                        c10::DeviceType device_type, const std::string& name,
                                                        std::chrono::milliseconds timeout) {
#if REMAT_TORCH_VERSION_AT_LEAST(2, 0)
  const auto type = name == "nccl" ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
#if REMAT_TORCH_VERSION_AT_LEAST(2, 6)
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
#else
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size,
                                                       c10::make_intrusive<c10d::ProcessGroup::Options>(name, timeout));
#endif
  group->setBackend(device_type, type, backend);
  group->setDefaultBackend(type);
  return group;
#else
  (void)store, (void)rank, (void)size, (void)device_type, (void)name, (void)timeout;
  return backend;
#endif
}

}  // namespace remat::distributed::compat
