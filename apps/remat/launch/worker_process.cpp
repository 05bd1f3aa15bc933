#include "launch/worker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <c10/util/Exception.h>

#include "remat/util/child_process.h"

namespace remat::cli::launch {
namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

WorkerProcess start_worker(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  if (argv.empty()) throw std::runtime_error("[launch] a worker needs a program to run");
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const auto close_all = [&] {
    for (int* fd : {&null_fd, &out_pipe[0], &out_pipe[1], &err_pipe[0], &err_pipe[1]}) close_fd(*fd);
  };
  if (null_fd < 0 || pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    const std::string reason = std::strerror(errno);
    close_all();
    throw std::runtime_error("[launch] cannot start '" + argv[0] + "': " + reason);
  }
  util::ChildSpec spec;
  spec.argv = argv;
  spec.env = env;
  spec.stdin_fd = null_fd;
  spec.stdout_fd = out_pipe[1];
  spec.stderr_fd = err_pipe[1];
  // A launcher killed outright (SIGKILL) cannot stop its workers: the kernel sends SIGTERM, on
  // which the trainer saves a checkpoint and exits.
  spec.parent_death_signal = SIGTERM;
  pid_t pid = -1;
  try {
    pid = util::start_child(spec, "launch");
  } catch (const c10::Error& e) {
    close_all();
    throw std::runtime_error(e.what_without_backtrace());
  }
  close_fd(null_fd);
  close_fd(out_pipe[1]);
  close_fd(err_pipe[1]);
  return WorkerProcess{pid, out_pipe[0], err_pipe[0]};
}

void signal_worker(pid_t pid, int signal_number) { util::signal_child_group(pid, signal_number); }

}  // namespace remat::cli::launch
