#include "child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "remat/util/child_process.h"
#include "remat/util/error.h"

namespace remat::ui::detail {

namespace {

bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Resident anonymous bytes of `pid`: resident minus file-backed and shared pages, from
// /proc/<pid>/statm (proc(5): size resident shared text lib data dt, in pages). -1 when unreadable.
int64_t resident_anonymous_bytes(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/statm", static_cast<int>(pid));
  FILE* file = std::fopen(path, "re");
  if (file == nullptr) return -1;
  long long size = 0, resident = 0, shared = 0;
  const int got = std::fscanf(file, "%lld %lld %lld", &size, &resident, &shared);
  std::fclose(file);
  if (got != 3) return -1;
  return (resident - shared) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

BoundedChildResult run_bounded_child(const std::vector<std::string>& args, const std::string& input,
                                     const ChildLimits& limits, const std::atomic<bool>* cancel) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(std::max(0.0, limits.timeout_s)));
  // The input goes into a memory file before the fork: the child reads it at its own pace and
  // the server never blocks on (or gets SIGPIPE from) a pipe the child does not drain.
  const int in_fd = ::memfd_create("remat-ui-child-input", MFD_CLOEXEC);
  int out_pipe[2] = {-1, -1};
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  const bool ready = in_fd >= 0 && null_fd >= 0 && write_all(in_fd, input) && ::lseek(in_fd, 0, SEEK_SET) == 0 &&
                     ::pipe2(out_pipe, O_CLOEXEC) == 0;
  const int setup_errno = errno;
  if (!ready) {
    for (int fd : {in_fd, null_fd, out_pipe[0], out_pipe[1]}) {
      if (fd >= 0) ::close(fd);
    }
    throw_value_error(std::string("[ui] cannot start a child process of the remat binary: ") +
                      std::strerror(setup_errno));
  }
  util::ChildSpec spec;
  spec.argv = args;
  spec.stdin_fd = in_fd;
  spec.stdout_fd = out_pipe[1];
  spec.stderr_fd = null_fd;
  spec.parent_death_signal = SIGKILL;  // a profile must not outlive the server that bounds it
  pid_t pid = -1;
  try {
    pid = util::start_child(spec, "ui");
  } catch (...) {
    for (int fd : {in_fd, null_fd, out_pipe[0], out_pipe[1]}) ::close(fd);
    throw;
  }
  for (int fd : {in_fd, null_fd, out_pipe[1]}) ::close(fd);

  BoundedChildResult result;
  bool killed = false;
  // Kills the child when a limit is crossed or a cancel asked for; says whether it did.
  const auto enforce_limits = [&] {
    if (killed) return true;
    const int64_t resident = resident_anonymous_bytes(pid);
    result.peak_resident_bytes = std::max(result.peak_resident_bytes, resident);
    if (cancel != nullptr && cancel->load()) {
      result.cancelled = true;
    } else if (limits.resident_bytes > 0 && resident > limits.resident_bytes) {
      result.memory_exceeded = true;
    } else if (Clock::now() >= deadline) {
      result.timed_out = true;
    } else {
      return false;
    }
    util::signal_child_group(pid, SIGKILL);
    killed = true;
    return true;
  };
  // Read stdout until the child closes it, checking the limits every 20 ms: the memory check
  // lets a child overshoot by what it can touch in that time (some 100 MiB), but, unlike
  // RLIMIT_AS or RLIMIT_DATA, it counts memory in use and not address space reserved (OpenBLAS
  // reserves 128 MiB per thread; under such a limit its allocator retries for ever).
  char buffer[65536];
  while (!enforce_limits()) {
    pollfd p{out_pipe[0], POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;  // a slice without output, or EINTR
    const ssize_t n = ::read(out_pipe[0], buffer, sizeof(buffer));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;  // end of file: the child closed its stdout, normally by exiting
    const size_t room = limits.max_output_bytes - std::min(limits.max_output_bytes, result.output.size());
    result.output.append(buffer, std::min(room, static_cast<size_t>(n)));
    if (static_cast<size_t>(n) > room) result.output_truncated = true;
  }
  ::close(out_pipe[0]);
  // Wait for the exit under the same limits: a child that closed its stdout and went on is
  // killed like one that ran too long.
  int status = 0;
  for (;;) {
    const pid_t got = ::waitpid(pid, &status, killed ? 0 : WNOHANG);
    if (got == pid) break;
    if (got < 0 && errno != EINTR) break;
    if (got == 0 && !enforce_limits()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

}  // namespace remat::ui::detail
