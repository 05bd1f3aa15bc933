// `remat ui [--host 127.0.0.1] [--port 8080] [--workspace DIR]`: the web page to configure,
// check, start and watch training runs (remat/ui/server.h, docs/UI.md). Ctrl-C or SIGTERM stops
// the server; runs it started are stopped with SIGINT first, so each saves a checkpoint.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <iostream>
#include <thread>

#include "command.h"
#include "parse_args.h"
#include "remat/ui/server.h"
#include "remat/ui/step_profile.h"

namespace remat::cli {
namespace {

int g_stop_pipe = -1;

extern "C" void on_ui_stop_signal(int) {
  const char byte = 's';
  (void)!write(g_stop_pipe, &byte, 1);
}

int run_ui(const std::vector<std::string>& args) {
  ui::ServerOptions options;
  CLI::App app{"Serve the web UI: configure, check, start and watch training runs", "ui"};
  app.add_option("--host", options.host,
                 "address to listen on; any address other than loopback requires the token printed at start")
      ->capture_default_str();
  app.add_option("--port", options.port, "TCP port")->check(CLI::Range(1, 65535))->capture_default_str();
  app.add_option("--workspace", options.workspace,
                 "folder of the UI's configs (configs/<name>/config.json) and runs (runs/<id>/); relative "
                 "paths in configs are relative to it")
      ->capture_default_str();
  // The server runs its own binary with this to profile a training step for POST /api/plan in a
  // child process with a memory limit (remat/ui/step_profile.h); not for people, so not in --help.
  bool profile_step = false;
  app.add_flag("--profile-step", profile_step, "read a config on stdin, write its step profile as JSON")->group("");
  if (auto code = parse_or_exit(app, args)) return *code;
  if (profile_step) return ui::run_step_profile_child(std::cin, std::cout);

  ui::Server server(options);
  server.bind();  // a busy port: c10::ValueError, exit 2
  // Relative paths in configs mean the same to validation and the planner here as to the runs,
  // which start in the workspace.
  if (chdir(server.workspace().c_str()) != 0) throw std::runtime_error("remat ui: cannot enter the workspace");
  std::cout << "remat ui: serving workspace " << server.workspace() << "\n"
            << "remat ui: open " << server.url() << "\n";
  if (!server.token().empty()) {
    std::cout << "remat ui: not on loopback: every request needs the token " << server.token()
              << " (the link above carries it). For a remote machine, prefer the default 127.0.0.1 and "
                 "an SSH tunnel (docs/UI.md).\n";
  }
  std::cout.flush();

  // SIGINT / SIGTERM reach whichever thread does not block them (LibTorch's and OpenMP's threads
  // exist before this point), and may have been ignored by a shell starting us in the
  // background: a handler writing to a pipe catches them all; a thread reads the pipe and stops
  // the server outside the handler.
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("remat ui: cannot create a pipe");
  g_stop_pipe = pipe_fds[1];
  struct sigaction action {};
  action.sa_handler = on_ui_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::thread waiter([&server, read_fd = pipe_fds[0]] {
    char byte = 0;
    while (read(read_fd, &byte, 1) < 0 && errno == EINTR) {
    }
    if (byte == 's') std::cerr << "\nremat ui: stopping (runs still going get SIGINT and save a checkpoint)\n";
    server.stop();
  });
  server.listen();
  // listen() returned without a signal (an error): wake the waiter so it can be joined.
  const char wake = 'w';
  (void)!write(pipe_fds[1], &wake, 1);
  waiter.join();
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  return 0;
}

REMAT_COMMAND("ui", "serve the web UI to configure, check, start and watch training runs", run_ui);

}  // namespace
}  // namespace remat::cli
