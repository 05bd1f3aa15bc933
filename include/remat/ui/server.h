#pragma once
/// \file
/// `remat ui`: an HTTP server (cpp-httplib) serving a page to configure, check, start and watch
/// training runs, and the JSON API behind it (docs/UI.md, "API"). The page's files are compiled
/// into the binary. Security (Note [UI security] in src/ui/security.cpp): loopback by default;
/// bound elsewhere, every request needs the random token printed at start; state-changing
/// requests need the X-Remat-UI header; files are confined to the workspace; bodies are bounded.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "remat/export.h"

namespace remat::ui {

/// The largest request body accepted by default (a config with its datasets is a few KiB).
inline constexpr size_t kDefaultMaxBodyBytes = size_t{1} << 20;

/// The memory a step profile behind POST /api/plan may use by default, at most (docs/UI.md, "The
/// planner's figures"): the figures preview the planner; profiles of larger shapes take minutes
/// on a CPU and belong to `remat bench` on the training machine.
inline constexpr int64_t kDefaultProfileMemoryCap = int64_t{2} << 30;
/// How long a step profile may run by default: flux-tiny at resolution 512, batch 4, bf16 takes
/// some 70 s on two busy cores.
inline constexpr double kDefaultProfileTimeoutSeconds = 120;

struct ServerOptions {
  /// The address to listen on. Loopback (127.0.0.0/8, ::1, localhost) needs no token.
  std::string host = "127.0.0.1";
  /// The port; 0 picks a free one (tests).
  int port = 8080;
  /// Where configs (configs/<name>/config.json) and run records (runs/<id>/) live; created if
  /// missing. Relative paths in configs are relative to it (runs start in it).
  std::string workspace = ".";
  /// The `remat` binary runs execute; empty: this process's own executable (/proc/self/exe).
  std::string remat_executable;
  /// Request bodies larger than this are refused (413).
  size_t max_body_bytes = kDefaultMaxBodyBytes;
  /// The memory one step profile behind POST /api/plan may use: the child process it runs in is
  /// killed when its resident memory goes beyond it, and a profile predicted to need more is
  /// refused before it starts.
  /// 0: half of the machine's available memory, at most kDefaultProfileMemoryCap.
  int64_t plan_memory_limit_bytes = 0;
  /// Seconds a step profile may run before its process is killed.
  double plan_timeout_s = kDefaultProfileTimeoutSeconds;
};

/// Whether `host` is a loopback address or name (no token needed there).
REMAT_API bool is_loopback_host(const std::string& host);

class REMAT_API Server {
 public:
  /// Creates the workspace (configs/, runs/) and, off loopback, the token. Throws
  /// c10::ValueError for a workspace that cannot be created or is not a directory.
  explicit Server(ServerOptions options);
  /// Stops listening and stops every running run (SIGINT, then waits for it).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds the socket. Throws c10::ValueError "[ui] port N on HOST is already in use ..." for a
  /// busy port, and names the address for any other failure.
  void bind();
  /// The bound port (after bind()).
  int port() const;
  /// The token requests must carry; empty when bound to loopback.
  const std::string& token() const;
  /// http://host:port/ (with ?token=... when a token is needed): what to open in a browser.
  std::string url() const;
  /// The canonical workspace directory.
  const std::string& workspace() const;
  /// Serves until stop() (blocks). bind() first.
  void listen();
  /// Makes listen() return; safe from another thread.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace remat::ui
