#include "launch/worker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace remat::cli::launch {
namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Runs in the child between fork and exec: async-signal-safe calls only (the launcher may have
// threads, LibTorch's among them, and one may have held malloc's lock at the fork).
[[noreturn]] void exec_child(pid_t launcher, const char* path, char* const argv[], char* const envp[],
                             int null_fd, int out_fd, int err_fd, int report_fd,
                             const sigset_t& launcher_mask) {
  // Its own group: the terminal's Ctrl-C goes to the launcher's group only, and the launcher
  // forwards exactly one SIGINT; were the worker in that group too, it would get two, and the
  // trainer aborts on the second instead of saving its checkpoint.
  setpgid(0, 0);
  // A launcher killed outright (SIGKILL) cannot stop its workers: the kernel sends SIGTERM, on
  // which the trainer saves a checkpoint and exits. If the launcher is already gone, stop now.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != launcher) _exit(1);
  // The launcher's handlers and ignored signals (SIGPIPE) must not carry over: ignored
  // dispositions survive exec.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);  // SIGKILL/SIGSTOP: EINVAL, fine
  dup2(null_fd, 0);
  dup2(out_fd, 1);
  dup2(err_fd, 2);
  // No other descriptor of the launcher (another worker's pipes above all, or its EOF would
  // never come) may live on in this worker; report_fd is close-on-exec and stays until exec.
  for (int fd = 3; fd < 65536; ++fd) {
    if (fd != report_fd) close(fd);
  }
  sigprocmask(SIG_SETMASK, &launcher_mask, nullptr);
  execve(path, argv, envp);
  const int error = errno;
  (void)!write(report_fd, &error, sizeof(error));
  _exit(127);
}

}  // namespace

WorkerProcess start_worker(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  if (argv.empty()) throw std::runtime_error("[launch] a worker needs a program to run");
  // Everything the child needs is built before the fork: it may not allocate.
  std::vector<char*> argv_c;
  for (const auto& arg : argv) argv_c.push_back(const_cast<char*>(arg.c_str()));
  argv_c.push_back(nullptr);
  std::vector<char*> env_c;
  for (const auto& entry : env) env_c.push_back(const_cast<char*>(entry.c_str()));
  env_c.push_back(nullptr);

  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, report_pipe[2] = {-1, -1};
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0 || pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0 ||
      pipe2(report_pipe, O_CLOEXEC) != 0) {
    const std::string reason = std::strerror(errno);
    for (int* fd : {&null_fd, &out_pipe[0], &out_pipe[1], &err_pipe[0], &err_pipe[1], &report_pipe[0], &report_pipe[1]}) {
      close_fd(*fd);
    }
    throw std::runtime_error("[launch] cannot start '" + argv[0] + "': " + reason);
  }

  // No signal handler of the launcher may run in the child before exec resets them.
  sigset_t all, launcher_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &launcher_mask);
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    exec_child(launcher, argv_c[0], argv_c.data(), env_c.data(), null_fd, out_pipe[1], err_pipe[1],
               report_pipe[1], launcher_mask);
  }
  const int fork_error = errno;
  pthread_sigmask(SIG_SETMASK, &launcher_mask, nullptr);
  if (pid > 0) setpgid(pid, pid);  // also here, so the group exists before any signal is sent to it
  close_fd(null_fd);
  close_fd(out_pipe[1]);
  close_fd(err_pipe[1]);
  close_fd(report_pipe[1]);
  if (pid < 0) {
    for (int* fd : {&out_pipe[0], &err_pipe[0], &report_pipe[0]}) close_fd(*fd);
    throw std::runtime_error("[launch] cannot start '" + argv[0] + "': fork failed: " + std::strerror(fork_error));
  }

  // exec closes the report pipe (EOF: started) or the child writes exec's errno into it.
  int exec_error = 0;
  ssize_t got;
  do {
    got = ::read(report_pipe[0], &exec_error, sizeof(exec_error));
  } while (got < 0 && errno == EINTR);
  close_fd(report_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof(exec_error))) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    close_fd(out_pipe[0]);
    close_fd(err_pipe[0]);
    throw std::runtime_error("[launch] cannot run '" + argv[0] + "': " + std::strerror(exec_error));
  }
  return WorkerProcess{pid, out_pipe[0], err_pipe[0]};
}

void signal_worker(pid_t pid, int signal_number) {
  // The group first (the worker and its children); the pid itself should the group be gone.
  if (::kill(-pid, signal_number) != 0) ::kill(pid, signal_number);
}

}  // namespace remat::cli::launch
