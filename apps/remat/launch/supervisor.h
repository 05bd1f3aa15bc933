#pragma once
// Running a node's workers to the end: their output prefixed with the rank, the launcher's
// SIGINT / SIGTERM forwarded, and the others stopped as soon as one fails.

#include <chrono>
#include <string>
#include <vector>

namespace remat::cli::launch {

/// One worker to start: the program (argv[0] is a path), its whole environment, its global rank.
struct WorkerSpec {
  std::vector<std::string> argv;
  std::vector<std::string> env;  ///< "KEY=VALUE" entries, exactly what the worker gets
  int rank = 0;                  ///< its output lines are prefixed "[rank<rank>]: "
};

struct SupervisorOptions {
  int stdout_fd = 1;  ///< where the workers' stdout lines go
  int stderr_fd = 2;  ///< where their stderr lines and the launcher's "[launch] ..." messages go
  /// After a failure, how long the other workers have to exit on SIGTERM before SIGKILL.
  std::chrono::milliseconds stop_grace{5000};
};

/// Starts the workers, copies each one's stdout and stderr, line by line with its rank prefix, to
/// `stdout_fd` / `stderr_fd`, and waits for all of them. Returns the launcher's exit code:
///  - 0 when every worker exits with code 0;
///  - when a worker fails (a non-zero exit code, a signal, or it cannot be started), the others
///    are sent SIGTERM, then SIGKILL after `stop_grace`, a message names the rank, pid and
///    reason, and the code is the failed worker's exit code, or 128 + its signal (127 when it
///    could not be started);
///  - when the launcher gets SIGINT or SIGTERM, it forwards it to every running worker (the
///    trainer saves a checkpoint and exits), a second one too, a third sends SIGKILL; the code
///    is 128 + the first signal (130 for Ctrl-C), unless a worker had already failed.
/// Installs handlers for SIGINT, SIGTERM and SIGCHLD and ignores SIGPIPE while it runs; restores
/// them before returning. Not reentrant (the handlers share one self-pipe).
int run_workers(const std::vector<WorkerSpec>& workers, const SupervisorOptions& options = {});

}  // namespace remat::cli::launch
