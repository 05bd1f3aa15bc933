#include "launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <optional>
#include <stdexcept>

#include "launch/exit_status.h"
#include "launch/line_prefixer.h"
#include "launch/signal_pipe.h"
#include "launch/worker_process.h"

namespace remat::cli::launch {
namespace {

using Clock = std::chrono::steady_clock;

// Output that is not read within this long after the last worker exited belongs to processes the
// workers left behind (still holding the pipes); the launcher stops waiting for it.
constexpr std::chrono::milliseconds kDrainAfterExit{1000};

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed stdout (EPIPE): the workers run on, their output is dropped
    done += static_cast<size_t>(n);
  }
}

struct Stream {
  int fd = -1;
  int out_fd = -1;  // where its lines go
  LinePrefixer prefixer;
};

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out, err;
};

class Supervisor {
 public:
  Supervisor(const std::vector<WorkerSpec>& specs, const SupervisorOptions& options)
      : specs_(specs), options_(options) {}

  int run() {
    start_all();
    while (!finished()) {
      poll_once();
      for (int sig : signals_.take()) {
        if (sig == SIGCHLD) reap();
        else on_launcher_signal(sig);
      }
      reap();  // also without SIGCHLD: a lost signal must not hang the launcher
      if (stop_deadline_ && Clock::now() >= *stop_deadline_) kill_stragglers();
    }
    for (auto& worker : workers_) {
      close_stream(worker.out);
      close_stream(worker.err);
    }
    if (failure_code_) return *failure_code_;
    if (interrupt_signal_) return 128 + interrupt_signal_;
    return 0;
  }

 private:
  void message(const std::string& text) { write_all(options_.stderr_fd, "[launch] " + text + "\n"); }

  static std::string worker_name(const Worker& worker) {
    return "rank " + std::to_string(worker.rank) + " (pid " + std::to_string(worker.pid) + ")";
  }

  int running_count() const {
    int n = 0;
    for (const auto& worker : workers_) n += worker.running ? 1 : 0;
    return n;
  }

  void start_all() {
    workers_.reserve(specs_.size());
    for (const auto& spec : specs_) {
      const std::string prefix = "[rank" + std::to_string(spec.rank) + "]: ";
      Worker worker{spec.rank, -1, false, 0, Stream{-1, options_.stdout_fd, LinePrefixer(prefix)},
                    Stream{-1, options_.stderr_fd, LinePrefixer(prefix)}};
      try {
        const WorkerProcess process = start_worker(spec.argv, spec.env);
        worker.pid = process.pid;
        worker.running = true;
        worker.out.fd = process.stdout_fd;
        worker.err.fd = process.stderr_fd;
        // Non-blocking reads: draining a pipe that a worker's leftover child still holds open
        // must not block the launcher.
        for (int fd : {worker.out.fd, worker.err.fd}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
        workers_.push_back(std::move(worker));
      } catch (const std::runtime_error& e) {
        const int started = running_count();
        std::string reason = e.what();
        if (reason.rfind("[launch] ", 0) == 0) reason.erase(0, 9);
        message(reason + " (rank " +
                std::to_string(spec.rank) + ")" +
                (started ? "; stopping the other " + std::to_string(started) + " worker(s)" : ""));
        failure_code_ = 127;  // the shell's "cannot execute"
        stop_all();
        return;
      }
    }
  }

  bool finished() {
    if (running_count() > 0) return false;
    if (!all_exited_at_) all_exited_at_ = Clock::now();
    bool open = false;
    for (const auto& worker : workers_) open = open || worker.out.fd >= 0 || worker.err.fd >= 0;
    return !open || Clock::now() - *all_exited_at_ >= kDrainAfterExit;
  }

  void poll_once() {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    std::vector<Stream*> streams{nullptr};
    for (auto& worker : workers_) {
      for (Stream* stream : {&worker.out, &worker.err}) {
        if (stream->fd < 0) continue;
        fds.push_back({stream->fd, POLLIN, 0});
        streams.push_back(stream);
      }
    }
    // Wake for the stop deadline and the drain limit; 1 s at most, so a lost SIGCHLD costs 1 s.
    auto timeout = std::chrono::milliseconds(1000);
    const auto now = Clock::now();
    for (const auto& deadline : {stop_deadline_, all_exited_at_ ? std::optional<Clock::time_point>(
                                                                      *all_exited_at_ + kDrainAfterExit)
                                                                : std::nullopt}) {
      if (!deadline) continue;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - now);
      timeout = std::max(std::chrono::milliseconds(0), std::min(timeout, left + std::chrono::milliseconds(1)));
    }
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
    if (ready <= 0) return;  // timeout, or EINTR: the loop looks again
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) read_stream(*streams[i]);
    }
  }

  void read_stream(Stream& stream) {
    char buffer[65536];
    const ssize_t n = ::read(stream.fd, buffer, sizeof(buffer));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      close_stream(stream);
      return;
    }
    const std::string lines = stream.prefixer.feed(buffer, static_cast<size_t>(n));
    if (!lines.empty()) write_all(stream.out_fd, lines);
  }

  // Copies what the pipe holds now (bounded: a leftover child may write on and on).
  void drain(Stream& stream) {
    char buffer[65536];
    for (int i = 0; i < 64 && stream.fd >= 0; ++i) {
      const ssize_t n = ::read(stream.fd, buffer, sizeof(buffer));
      if (n > 0) {
        write_all(stream.out_fd, stream.prefixer.feed(buffer, static_cast<size_t>(n)));
      } else if (n == 0 || errno != EINTR) {
        return;
      }
    }
  }

  void close_stream(Stream& stream) {
    if (stream.fd < 0) return;
    drain(stream);  // the last lines before a crash are the useful ones
    write_all(stream.out_fd, stream.prefixer.finish());
    ::close(stream.fd);
    stream.fd = -1;
  }

  void reap() {
    for (auto& worker : workers_) {
      if (!worker.running) continue;
      int status = 0;
      const pid_t got = ::waitpid(worker.pid, &status, WNOHANG);
      if (got != worker.pid) continue;
      worker.running = false;
      worker.status = status;
      on_exit(worker);
    }
  }

  void on_exit(Worker& worker) {
    if (succeeded(worker.status)) return;
    // Its last words (an error message) before the launcher's line about it.
    drain(worker.out);
    drain(worker.err);
    if (failure_code_ || interrupt_signal_) {
      // Already stopping: how each one ended is worth a line, but it is not a new failure.
      message(worker_name(worker) + " " + describe_wait_status(worker.status));
      return;
    }
    failure_code_ = exit_code_of(worker.status);
    const int others = running_count();
    message(worker_name(worker) + " " + describe_wait_status(worker.status) +
            (others ? "; stopping the other " + std::to_string(others) + " worker(s)" : ""));
    stop_all();
  }

  void stop_all() {
    for (auto& worker : workers_) {
      if (worker.running) signal_worker(worker.pid, SIGTERM);
    }
    stop_deadline_ = Clock::now() + options_.stop_grace;
  }

  void kill_stragglers() {
    stop_deadline_.reset();
    for (auto& worker : workers_) {
      if (!worker.running) continue;
      message(worker_name(worker) + " did not exit within " + std::to_string(options_.stop_grace.count()) +
              " ms of SIGTERM; sending SIGKILL");
      signal_worker(worker.pid, SIGKILL);
    }
  }

  void on_launcher_signal(int sig) {
    ++interrupts_;
    if (!interrupt_signal_) interrupt_signal_ = sig;
    const int running = running_count();
    if (running == 0) return;
    if (interrupts_ <= 2) {
      message(signal_name(sig) + ": forwarding it to " + std::to_string(running) + " worker(s)" +
              (interrupts_ == 1 ? " and waiting for them to exit (a third signal kills them)" : ""));
      for (auto& worker : workers_) {
        if (worker.running) signal_worker(worker.pid, sig);
      }
    } else {
      message(signal_name(sig) + " again: killing " + std::to_string(running) + " worker(s) (SIGKILL)");
      for (auto& worker : workers_) {
        if (worker.running) signal_worker(worker.pid, SIGKILL);
      }
    }
  }

  const std::vector<WorkerSpec>& specs_;
  const SupervisorOptions options_;
  SignalPipe signals_;  // before the first fork: no SIGCHLD may be missed
  std::vector<Worker> workers_;
  std::optional<int> failure_code_;
  int interrupt_signal_ = 0;
  int interrupts_ = 0;
  std::optional<Clock::time_point> stop_deadline_;
  std::optional<Clock::time_point> all_exited_at_;
};

}  // namespace

int run_workers(const std::vector<WorkerSpec>& workers, const SupervisorOptions& options) {
  return Supervisor(workers, options).run();
}

}  // namespace remat::cli::launch
