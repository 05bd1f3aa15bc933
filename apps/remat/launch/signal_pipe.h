#pragma once
// Signals as data: a handler that only writes the signal's number into a pipe, so the launcher's
// poll() loop sees SIGINT, SIGTERM and SIGCHLD next to the workers' output (the self-pipe trick).

#include <csignal>
#include <vector>

namespace remat::cli::launch {

/// While alive, SIGINT, SIGTERM and SIGCHLD are caught into a pipe and SIGPIPE is ignored (a
/// closed stdout must not kill the launcher while workers run); the destructor restores the
/// previous dispositions. One instance at a time.
class SignalPipe {
 public:
  SignalPipe();
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  /// The read end, non-blocking, for poll(): readable when a signal arrived.
  int fd() const { return read_fd_; }

  /// The signals caught since the last call, in order.
  std::vector<int> take();

 private:
  int read_fd_ = -1;
  struct sigaction old_int_ {}, old_term_ {}, old_chld_ {}, old_pipe_ {};
};

}  // namespace remat::cli::launch
