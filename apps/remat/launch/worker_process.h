#pragma once
// Starting one worker process (remat/util/child_process.h) with its output on pipes, and signalling it.

#include <sys/types.h>

#include <string>
#include <vector>

namespace remat::cli::launch {

/// A started worker: its pid (also its process group id) and the read ends of its output pipes.
struct WorkerProcess {
  pid_t pid = -1;
  int stdout_fd = -1;  ///< the worker's stdout, close-on-exec in the launcher
  int stderr_fd = -1;  ///< the worker's stderr, close-on-exec in the launcher
};

/// Starts `argv[0]` (a path: no PATH search) with arguments `argv` and exactly the environment
/// `env` ("KEY=VALUE"). The worker gets /dev/null as stdin, a pipe each for stdout and stderr,
/// its own process group (so a Ctrl-C at the terminal reaches only the launcher, which forwards
/// it once), the default action for every signal, no other descriptor of the launcher, and
/// SIGTERM should the launcher die first (Linux: PR_SET_PDEATHSIG).
/// Throws std::runtime_error naming the program and the reason when it cannot be started (fork
/// fails, or exec does: the error reaches the launcher through a close-on-exec pipe).
WorkerProcess start_worker(const std::vector<std::string>& argv, const std::vector<std::string>& env);

/// Sends `signal_number` to the worker's process group: the worker and whatever it started.
void signal_worker(pid_t pid, int signal_number);

}  // namespace remat::cli::launch
