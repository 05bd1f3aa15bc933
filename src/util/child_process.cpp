// Starting child processes from a threaded program (remat/util/child_process.h).
#include "remat/util/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "remat/util/error.h"

namespace remat::util {
namespace {

// What the child reports through its close-on-exec pipe when it cannot go on.
enum class ChildStep : int { enter_directory = 1, execute = 2 };
struct ChildFailure {
  ChildStep step;
  int error;
};

// Everything the child uses, prepared before the fork: it may not allocate.
struct PreparedChild {
  const char* path;
  char* const* argv;
  char* const* envp;  // nullptr: the parent's environment
  const char* directory;  // nullptr: stays
  int stdio[3];
  int report_fd;
  int parent_death_signal;
  pid_t parent;
};

void close_all_but_stdio_and(int keep) {
#ifdef SYS_close_range
  const unsigned low = 3, high = ~0u, k = static_cast<unsigned>(keep);
  const bool closed = keep < 3 ? syscall(SYS_close_range, low, high, 0u) == 0
                               : (k == low || syscall(SYS_close_range, low, k - 1, 0u) == 0) &&
                                     syscall(SYS_close_range, k + 1, high, 0u) == 0;
  if (closed) return;
#endif
  for (int fd = 3; fd < 65536; ++fd) {
    if (fd != keep) close(fd);
  }
}

[[noreturn]] void report_and_exit(int report_fd, ChildStep step, int error) {
  const ChildFailure failure{step, error};
  (void)!write(report_fd, &failure, sizeof(failure));
  _exit(127);
}

// Runs in the child between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(const PreparedChild& c) {
  setpgid(0, 0);
  if (c.parent_death_signal != 0) {
    prctl(PR_SET_PDEATHSIG, c.parent_death_signal);
    if (getppid() != c.parent) _exit(1);  // the parent died before the request took hold
  }
  // Dispositions first, the mask last: a handler of the parent must never run here.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);  // SIGKILL/SIGSTOP: EINVAL, fine
  if (c.directory != nullptr && chdir(c.directory) != 0) report_and_exit(c.report_fd, ChildStep::enter_directory, errno);
  // dup2 clears close-on-exec on the copies; a descriptor already in its place keeps its flag.
  for (int target = 0; target < 3; ++target) {
    if (c.stdio[target] == target) {
      fcntl(target, F_SETFD, 0);
    } else {
      dup2(c.stdio[target], target);
    }
  }
  close_all_but_stdio_and(c.report_fd);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (c.envp != nullptr) {
    execve(c.path, c.argv, c.envp);
  } else {
    execv(c.path, c.argv);
  }
  report_and_exit(c.report_fd, ChildStep::execute, errno);
}

std::vector<char*> pointers_to(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

pid_t start_child(const ChildSpec& spec, const std::string& component) {
  if (spec.argv.empty()) throw_value_error("[" + component + "] a child process needs a program to run");
  const std::string& program = spec.argv.front();
  const auto fail = [&](const std::string& what, int error) {
    throw_value_error("[" + component + "] cannot start '" + program + "': " + what + ": " + std::strerror(error));
  };
  for (int fd : {spec.stdin_fd, spec.stdout_fd, spec.stderr_fd}) {
    if (fd < 0) throw_value_error("[" + component + "] cannot start '" + program + "': a standard stream is missing");
  }
  const std::vector<char*> argv = pointers_to(spec.argv);
  std::vector<char*> envp;
  if (spec.env) envp = pointers_to(*spec.env);
  int report[2] = {-1, -1};
  if (::pipe2(report, O_CLOEXEC) != 0) fail("cannot create a pipe", errno);
  const PreparedChild child{program.c_str(),
                            argv.data(),
                            spec.env ? envp.data() : nullptr,
                            spec.directory.empty() ? nullptr : spec.directory.c_str(),
                            {spec.stdin_fd, spec.stdout_fd, spec.stderr_fd},
                            report[1],
                            spec.parent_death_signal,
                            ::getpid()};

  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = ::fork();
  if (pid == 0) exec_child(child);
  const int fork_error = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    fail("fork failed", fork_error);
  }
  // As the child does: whichever runs first, the group exists before any signal is sent to it.
  ::setpgid(pid, pid);

  // exec closes the pipe (end of file: started) or the child writes why it could not go on.
  ChildFailure failure{};
  ssize_t got;
  do {
    got = ::read(report[0], &failure, sizeof(failure));
  } while (got < 0 && errno == EINTR);
  ::close(report[0]);
  if (got == static_cast<ssize_t>(sizeof(failure))) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    const std::string where =
        failure.step == ChildStep::enter_directory ? "cannot enter '" + spec.directory + "': " : std::string();
    throw_value_error("[" + component + "] cannot run '" + program + "': " + where + std::strerror(failure.error));
  }
  return pid;
}

void signal_child_group(pid_t pid, int signal_number) {
  // Before the child has run setpgid its group may not exist yet; then the child alone.
  if (::kill(-pid, signal_number) != 0) ::kill(pid, signal_number);
}

}  // namespace remat::util
