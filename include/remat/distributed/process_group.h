#pragma once
/// \file
/// The processes of one training run, connected through PyTorch's own distributed engine, c10d:
/// a TCPStore rendezvous at MASTER_ADDR:MASTER_PORT (rank 0 serves it) and a Gloo process group
/// (CPU tensors) or NCCL (CUDA tensors, in builds with REMAT_WITH_CUDA). remat has no
/// communication code of its own; this class only names c10d's operations in remat's terms and
/// turns their failures into messages that say which rank, which operation and what to check.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "remat/distributed/environment.h"
#include "remat/export.h"

namespace remat::distributed {

/// The collective library: Gloo for CPU tensors, NCCL for CUDA.
enum class Backend { gloo, nccl };

REMAT_API std::string to_string(Backend backend);

/// "auto" (or ""): NCCL for a CUDA device, Gloo otherwise; "gloo" or "nccl" as asked. Throws
/// c10::ValueError for another name, for NCCL without a CUDA device or in a build without
/// REMAT_WITH_CUDA, and for Gloo with a CUDA device in a build without it (Gloo then needs CUDA
/// kernels remat does not compile).
REMAT_API Backend choose_backend(const std::string& requested, const c10::Device& device);

/// The environment variable that overrides the automatic choice ("auto", "gloo", "nccl").
inline constexpr const char* kBackendVariable = "REMAT_DISTRIBUTED_BACKEND";

/// One process's membership of the run. Every collective must be called by every rank, in the
/// same order (c10d's rule); each blocks until all ranks have joined it or the timeout passes.
class REMAT_API ProcessGroup {
 public:
  /// Joins the run: rank 0 opens the rendezvous store on MASTER_PORT (a port in use is a clear
  /// error), every rank connects to it (an unreachable master fails after env.timeout naming
  /// the address), then the process group forms. Throws c10::ValueError for either failure.
  /// A group of one process works too (tests and benchmarks run the real reducer with it).
  static std::unique_ptr<ProcessGroup> connect(const LaunchEnvironment& env, Backend backend);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  const LaunchEnvironment& environment() const;
  int rank() const { return environment().rank; }
  int world_size() const { return environment().world_size; }
  Backend backend() const;

  /// Waits for every rank; `why` names the point in the run for a timeout's message.
  void barrier(const std::string& why);
  /// Copies root's tensors into every rank's (same shapes and dtypes on every rank), in place.
  void broadcast(std::vector<at::Tensor>& tensors, int root, const std::string& why);
  /// Sums each tensor over the ranks, in place (the same result on every rank).
  void all_reduce_sum(std::vector<at::Tensor>& tensors, const std::string& why);
  /// Starts the sum of `tensors`, flattened and concatenated into one tensor, without waiting;
  /// wait() returns that sum once every rank's contribution is in. For numbers read later (the
  /// losses of a step, summed while the next steps run).
  class REMAT_API PendingSum {
   public:
    PendingSum();
    PendingSum(PendingSum&&) noexcept;
    PendingSum& operator=(PendingSum&&) noexcept;
    ~PendingSum();
    at::Tensor wait();
    struct State;

   private:
    friend class ProcessGroup;
    std::unique_ptr<State> state_;
  };
  PendingSum all_reduce_sum_async(std::vector<at::Tensor> tensors, const std::string& why);

  /// Checks that every rank holds the same `value` of `what` (a configuration's canonical text,
  /// say): each rank publishes it through the store and compares with rank 0's. Throws
  /// c10::ValueError on every rank that differs, naming both ranks and the first line that differs.
  void check_same_on_all_ranks(const std::string& what, const std::string& value);

  /// c10d's own process group, for the gradient reducer (remat/distributed/gradient_reducer.h).
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Runs `operation` (a collective or a rendezvous) and turns a c10d failure into a
/// c10::ValueError that names this rank, `why`, the timeout and its variable, and c10d's message.
/// Every ProcessGroup method goes through it; the trainer wraps its step in it too (a gradient
/// all-reduce fails inside backward).
REMAT_API void with_collective_errors(const LaunchEnvironment& env, const std::string& why,
                                      const std::function<void()>& operation);

}  // namespace remat::distributed
