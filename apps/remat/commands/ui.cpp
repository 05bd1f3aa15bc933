// `remat ui [--host 127.0.0.1] [--port 8080] [--workspace DIR]`: the web page to configure,
// check, start and watch training runs (remat/ui/server.h, docs/UI.md). Ctrl-C or SIGTERM stops
// the server; runs it started are stopped with SIGINT first, so each saves a checkpoint.
#include <pthread.h>
#include <signal.h>

#include <iostream>
#include <thread>

#include "command.h"
#include "parse_args.h"
#include "remat/ui/server.h"

namespace remat::cli {
namespace {

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
  if (auto code = parse_or_exit(app, args)) return *code;

  // Signals go to one waiting thread (blocked everywhere else, inherited by the server's
  // threads), which stops the server outside a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ui::Server server(options);
  server.bind();  // a busy port: c10::ValueError, exit 2
  std::cout << "remat ui: serving workspace " << server.workspace() << "\n"
            << "remat ui: open " << server.url() << "\n";
  if (!server.token().empty()) {
    std::cout << "remat ui: not on loopback: every request needs the token " << server.token()
              << " (the link above carries it). For a remote machine, prefer the default 127.0.0.1 and "
                 "an SSH tunnel (docs/UI.md).\n";
  }
  std::cout.flush();
  std::thread waiter([&server, stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::cerr << "\nremat ui: stopping (runs still going get SIGINT and save a checkpoint)\n";
    server.stop();
  });
  server.listen();
  // listen() returned without a signal (an error): wake the waiter so it can be joined.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return 0;
}

REMAT_COMMAND("ui", "serve the web UI to configure, check, start and watch training runs", run_ui);

}  // namespace
}  // namespace remat::cli
