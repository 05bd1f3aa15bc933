#pragma once
// A `remat ui` server in the test process on a free port, and an httplib client for it.

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "remat/ui/server.h"
#include "temp_dir.h"
#include "test_paths.h"

namespace remat::testing {

class UiServer {
 public:
  explicit UiServer(remat::ui::ServerOptions options) {
    options.port = 0;
    options.remat_executable = remat::testing::cli_path();
    server_ = std::make_unique<remat::ui::Server>(options);
    server_->bind();
    thread_ = std::thread([this] { server_->listen(); });
    // listen() is running once a request is answered.
    for (int i = 0; i < 200; ++i) {
      httplib::Client probe("127.0.0.1", server_->port());
      if (probe.Get("/api/options")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~UiServer() {
    server_->stop();
    thread_.join();
  }
  remat::ui::Server& server() { return *server_; }
  int port() const { return server_->port(); }
  /// A client with the loopback Host header and, when given, the CSRF header.
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(120, 0);
    return c;
  }

 private:
  std::unique_ptr<remat::ui::Server> server_;
  std::thread thread_;
};

inline const httplib::Headers kUiHeader = {{"X-Remat-UI", "1"}};

inline nlohmann::json body_json(const httplib::Result& r) {
  if (!r) return nlohmann::json();
  return nlohmann::json::parse(r->body, nullptr, false);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace remat::testing
