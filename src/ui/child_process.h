#pragma once
// The remat binary run as a child process of the server: training runs (runs.cpp) and the
// planner's step profiles (plan_figures.cpp). The server is multithreaded, so what happens
// between fork and exec is written once, here, from async-signal-safe calls only.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace remat::ui::detail {

/// The child's stdin, stdout and stderr (descriptors of the parent, duplicated onto 0, 1, 2).
struct ChildStdio {
  int in = -1;
  int out = -1;
  int err = -1;
};

/// In the child of a fork() of the server: unblocks every signal and restores SIGINT, SIGTERM
/// and SIGPIPE to their defaults (`remat ui` handles them in the parent), makes the child the
/// leader of its own process group (a Ctrl-C at the server's terminal reaches the server only;
/// the server forwards what each child needs), asks for SIGKILL when the forking thread ends if
/// `die_with_parent` (a profile must not outlive the server that bounds it; a training run
/// may), enters `directory` (nullptr: stays), duplicates `stdio` onto 0, 1, 2, closes every
/// other descriptor (the listening socket above all) and executes `argv` (argv[0] the binary).
/// Only async-signal-safe calls: another thread may have held a lock (malloc's, a stream's) at
/// the moment of the fork. Never returns: exit code 126 when `directory` cannot be entered, 127
/// when the binary cannot be executed.
[[noreturn]] void exec_in_child(const char* directory, ChildStdio stdio, bool die_with_parent, char* const argv[]);

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
