#pragma once
// The remat binary run as a bounded child process of the server: the planner's step profiles
// (plan_figures.cpp), within a memory, time and output limit. The child is started by
// remat/util/child_process.h, as the server's training runs are (runs.cpp).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace remat::ui::detail {

/// What a bounded child may use.
struct ChildLimits {
  /// Its resident anonymous memory (what it takes from the machine: heap, tensors, stacks; not
  /// the shared libraries' pages), checked every 20 ms; beyond it the child is killed.
  int64_t resident_bytes = 0;
  double timeout_s = 0;           ///< wall-clock seconds, then it is killed
  size_t max_output_bytes = 0;    ///< of its stdout kept; the rest is read and dropped
};

/// How a bounded child ended.
struct BoundedChildResult {
  std::string output;             ///< its stdout, at most ChildLimits::max_output_bytes of it
  bool output_truncated = false;
  bool memory_exceeded = false;   ///< killed for going beyond ChildLimits::resident_bytes
  bool timed_out = false;         ///< killed after ChildLimits::timeout_s
  bool cancelled = false;         ///< killed because `cancel` became true
  int64_t peak_resident_bytes = 0;  ///< the most resident anonymous memory seen
  int exit_code = -1;             ///< its exit status; -1 when a signal ended it
  int signal = 0;                 ///< the signal that ended it, 0 when it exited
};

/// Runs `args` (args[0] the binary) with `input` as its stdin (a memfd, written before the child
/// starts, so no write can block), its stdout captured and its stderr discarded, within
/// `limits`: beyond them, or when `*cancel` becomes true, its process group gets SIGKILL. Blocks
/// the calling thread only, and reaps the child before returning. Throws c10::ValueError
/// "[ui] cannot start ..." when the child cannot be created.
BoundedChildResult run_bounded_child(const std::vector<std::string>& args, const std::string& input,
                                     const ChildLimits& limits, const std::atomic<bool>* cancel);

}  // namespace remat::ui::detail
