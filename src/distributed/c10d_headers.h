#pragma once
// c10d's headers, in one place: they need USE_C10D_GLOO (set by src/CMakeLists.txt for this
// layer) and, on Debian's LibTorch, the include shim in shim/ (see its comment). Only this
// layer's sources include them; remat's public headers never do.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <memory>
#include <type_traits>

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

/// DDP's bucketed reducer. 1.13's constructor takes the per-bucket size limits of the assignment
/// (compute_bucket_assignment_by_size's second result); later releases dropped that argument and
/// added skip_all_reduce_unused_params, use_python_reducer and a rebuild size list
/// (torch/csrc/distributed/c10d/reducer.hpp, Reducer::Reducer). Chosen by the signature present,
/// so a release between the two that has either one compiles too.
inline std::unique_ptr<c10d::Reducer> make_reducer(std::vector<at::Tensor> params,
                                                   std::vector<std::vector<size_t>> bucket_indices,
                                                   std::vector<size_t> per_bucket_size_limits,
                                                   c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                   std::vector<bool> expect_sparse, int64_t bucket_bytes_cap,
                                                   bool find_unused_parameters, bool gradient_as_bucket_view,
                                                   std::unordered_map<size_t, std::string> param_names,
                                                   int64_t first_bucket_bytes_cap) {
  using Indices = std::vector<std::vector<size_t>>;
  using Names = std::unordered_map<size_t, std::string>;
  if constexpr (std::is_constructible_v<c10d::Reducer, std::vector<at::Tensor>, Indices, std::vector<size_t>,
                                        c10::intrusive_ptr<c10d::ProcessGroup>, std::vector<bool>, int64_t, bool,
                                        bool, Names, int64_t>) {
    return std::make_unique<c10d::Reducer>(std::move(params), std::move(bucket_indices),
                                           std::move(per_bucket_size_limits), std::move(group),
                                           std::move(expect_sparse), bucket_bytes_cap, find_unused_parameters,
                                           gradient_as_bucket_view, std::move(param_names), first_bucket_bytes_cap);
  } else {
    // An empty rebuild list: buckets are rebuilt with first_bucket_bytes_cap, then bucket_bytes_cap
    // (what DistributedDataParallel passes when no bucket_cap_mb_list is given).
    return std::make_unique<c10d::Reducer>(std::move(params), std::move(bucket_indices), std::move(group),
                                           std::move(expect_sparse), bucket_bytes_cap, find_unused_parameters,
                                           gradient_as_bucket_view, std::move(param_names), first_bucket_bytes_cap,
                                           /*skip_all_reduce_unused_params=*/false,
                                           /*use_python_reducer=*/false, std::vector<int64_t>{});
  }
}

}  // namespace remat::distributed::compat
