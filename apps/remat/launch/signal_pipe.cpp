#include "launch/signal_pipe.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace remat::cli::launch {
namespace {

int g_write_fd = -1;  // the handler's only state; -1 while no SignalPipe exists

extern "C" void on_signal(int sig) {
  const int saved_errno = errno;  // the interrupted code may be about to read errno
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (g_write_fd >= 0) (void)!::write(g_write_fd, &byte, 1);  // full pipe: the signal is dropped, harmless
  errno = saved_errno;
}

void install(int sig, void (*handler)(int), int flags, struct sigaction* old) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = flags;
  sigaction(sig, &action, old);
}

}  // namespace

SignalPipe::SignalPipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::runtime_error(std::string("[launch] cannot create a pipe: ") + std::strerror(errno));
  }
  read_fd_ = fds[0];
  g_write_fd = fds[1];
  install(SIGINT, on_signal, SA_RESTART, &old_int_);
  install(SIGTERM, on_signal, SA_RESTART, &old_term_);
  install(SIGCHLD, on_signal, SA_RESTART | SA_NOCLDSTOP, &old_chld_);
  install(SIGPIPE, SIG_IGN, 0, &old_pipe_);
}

SignalPipe::~SignalPipe() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGCHLD, &old_chld_, nullptr);
  sigaction(SIGPIPE, &old_pipe_, nullptr);
  const int write_fd = g_write_fd;
  g_write_fd = -1;  // before the close: the fd number may be reused at once
  ::close(write_fd);
  ::close(read_fd_);
}

std::vector<int> SignalPipe::take() {
  std::vector<int> signals;
  unsigned char buffer[64];
  ssize_t got;
  while ((got = ::read(read_fd_, buffer, sizeof(buffer))) > 0) {
    for (ssize_t i = 0; i < got; ++i) signals.push_back(buffer[i]);
  }
  return signals;
}

}  // namespace remat::cli::launch
