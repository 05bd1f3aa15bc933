#pragma once
// A `remat ui` server in the test process on a free port, an httplib client for it, and raw
// connections for what httplib's client never sends.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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
    if (options.remat_executable.empty()) options.remat_executable = remat::testing::cli_path();
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

/// The "error" of a JSON answer; empty when the body is not a JSON object holding one.
inline std::string error_of(const std::string& body) {
  const nlohmann::json answer = nlohmann::json::parse(body, nullptr, false);
  const bool has = answer.is_object() && answer.contains("error") && answer["error"].is_string();
  return has ? answer["error"].get<std::string>() : "";
}

/// A TCP connection to 127.0.0.1:`port` (-1 when it cannot connect); the caller closes it.
inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Sends `request` as it is on a new connection and reads the answer until the server closes it.
inline std::string raw_exchange(int port, const std::string& request) {
  const int fd = connect_loopback(port);
  if (fd < 0) return "";
  const timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) answer.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  return answer;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace remat::testing
