#include "remat/ui/server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <c10/util/Exception.h>

#include "api.h"
#include "connection_limits.h"
#include "embedded_files.h"
#include "plan_figures.h"
#include "runs.h"
#include "remat/util/error.h"
#include "security.h"

namespace remat::ui {
namespace fs = std::filesystem;
using detail::send_error;

struct Server::Impl {
  ServerOptions options;
  std::string workspace;
  std::string token;
  int port = 0;
  httplib::Server http;
  detail::ApiContext context;
  std::unique_ptr<detail::PlanCache> plans;
  // The socket httplib listens on, as its socket-options callback saw it (-1 before bind()).
  int listening_socket = -1;
  // Declared last: destroyed first, so runs are stopped before the rest goes.
  std::unique_ptr<detail::RunManager> runs;
};

namespace {

// Whether something already listens on host:port: a bind(2) with SO_REUSEADDR (as the server
// binds, reuse_address below) fails with EADDRINUSE only then. httplib's own bind reports a bare
// false, so this probe gives the message its reason.
int probe_bind_errno(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result) != 0) return EADDRNOTAVAIL;
  int error = 0;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    error = ::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    ::close(fd);
    break;
  }
  freeaddrinfo(result);
  return error;
}

// The listening socket's options, in place of cpp-httplib's default_socket_options, which sets
// SO_REUSEPORT alone on Linux: the connections such a server closed stay in TIME_WAIT for up to
// a minute without SO_REUSEADDR, and a new server's bind (and the probe above) was refused until
// they expired. With SO_REUSEADDR a bind succeeds unless a socket listens on the port (socket(7)),
// so a restart binds at once and a live server is still reported.
void reuse_address(socket_t sock) {
  const int yes = 1;
  ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

// The page's files: "/" is index.html; the other names are served as they are embedded.
void add_asset_routes(httplib::Server& http) {
  const auto serve = [](const std::string& name, httplib::Response& res) {
    const detail::EmbeddedFile* file = detail::find_embedded_file(name);
    if (file == nullptr || name.rfind("help/", 0) == 0) {
      send_error(res, 404, "[ui] no such page file: '" + name + "'");
      return;
    }
    res.set_content(std::string(file->bytes()), detail::content_type_of(name).c_str());
  };
  http.Get("/", [serve](const httplib::Request&, httplib::Response& res) { serve("index.html", res); });
  http.Get(R"(/([A-Za-z0-9_-][A-Za-z0-9_.-]*))",
           [serve](const httplib::Request& req, httplib::Response& res) { serve(req.matches[1], res); });
}

}  // namespace

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  std::error_code ec;
  const fs::path root = impl_->options.workspace.empty() ? fs::path(".") : fs::path(impl_->options.workspace);
  for (const char* sub : {"configs", "runs"}) fs::create_directories(root / sub, ec);
  if (!fs::is_directory(root / "configs")) {
    throw_value_error("[ui] --workspace must be a directory remat can create and write, got '" +
                      root.string() + "'");
  }
  if (!(impl_->options.plan_timeout_s > 0)) {
    throw_value_error("[ui] plan_timeout_s must be a number of seconds > 0, got " +
                      std::to_string(impl_->options.plan_timeout_s));
  }
  if (impl_->options.plan_memory_limit_bytes < 0) {
    throw_value_error("[ui] plan_memory_limit_bytes must be a number of bytes > 0, or 0 for the default, got " +
                      std::to_string(impl_->options.plan_memory_limit_bytes));
  }
  impl_->workspace = fs::canonical(root).string();
  impl_->context.workspace = impl_->workspace;
  if (!is_loopback_host(impl_->options.host)) impl_->token = detail::random_token();
  std::string executable = impl_->options.remat_executable;
  if (executable.empty()) executable = fs::read_symlink("/proc/self/exe", ec).string();
  if (executable.empty()) throw_value_error("[ui] cannot find this program's executable (/proc/self/exe)");
  impl_->runs = std::make_unique<detail::RunManager>(impl_->workspace, executable);
  impl_->context.runs = impl_->runs.get();
  impl_->plans = std::make_unique<detail::PlanCache>(executable, impl_->options.plan_memory_limit_bytes,
                                                     impl_->options.plan_timeout_s);
  impl_->context.plans = impl_->plans.get();

  httplib::Server& http = impl_->http;
  // httplib closes the sockets it could not bind; the last one seen is the one it listens on.
  http.set_socket_options([impl = impl_.get()](socket_t sock) {
    reuse_address(sock);
    impl->listening_socket = sock;
  });
  detail::apply_connection_limits(http);
  http.set_payload_max_length(impl_->options.max_body_bytes);
  const std::string token = impl_->token;
  http.set_pre_routing_handler([token](const httplib::Request& req, httplib::Response& res) {
    // Never cached, never sniffed, never a referrer carrying ?token= elsewhere.
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Referrer-Policy", "no-referrer");
    res.set_header("X-Frame-Options", "DENY");
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
                   "frame-ancestors 'none'");
    if (const auto refusal = detail::check_request(req, token)) {
      send_error(res, refusal->status, refusal->message);
      return httplib::Server::HandlerResponse::Handled;
    }
    // The page's first load carries ?token=; the cookie lets its scripts, styles and images in.
    if (!token.empty() && req.has_param("token")) {
      res.set_header("Set-Cookie", "remat_ui_token=" + token + "; Path=/; HttpOnly; SameSite=Strict");
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const detail::NotFound& e) {
      send_error(res, 404, e.what());
    } catch (const c10::ValueError& e) {
      send_error(res, 400, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      send_error(res, 500, e.what_without_backtrace());
    } catch (const std::exception& e) {
      send_error(res, 500, e.what());
    } catch (...) {
      send_error(res, 500, "[ui] unknown error");
    }
  });
  // httplib's own refusals (413 for a large body, 404 for no route) get a JSON body too.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 413) {
      send_error(res, 413, "[ui] the request body is larger than the server's limit");
    } else if (res.status == 404) {
      send_error(res, 404, "[ui] no such endpoint: " + req.method + " " + req.path);
    } else {
      send_error(res, res.status, "[ui] request refused (HTTP " + std::to_string(res.status) + ")");
    }
    return httplib::Server::HandlerResponse::Handled;
  }));

  add_asset_routes(http);
  detail::add_options_routes(http, impl_->context);
  detail::add_validate_routes(http, impl_->context);
  detail::add_plan_routes(http, impl_->context);
  detail::add_config_routes(http, impl_->context);
  detail::add_run_routes(http, impl_->context);
}

Server::~Server() {
  stop();
  if (impl_->runs) impl_->runs->stop_all(120.0);
}

void Server::bind() {
  const std::string& host = impl_->options.host;
  const int port = impl_->options.port;
  if (port < 0 || port > 65535) throw_value_error("[ui] --port must be in [0, 65535], got " + std::to_string(port));
  const int probe = port == 0 ? 0 : probe_bind_errno(host, port);
  if (probe == EADDRINUSE) {
    throw_value_error("[ui] port " + std::to_string(port) + " on " + host +
                      " is already in use (another `remat ui` or another server); stop it or choose "
                      "another with --port");
  }
  if (probe != 0) {
    throw_value_error("[ui] cannot listen on " + host + ":" + std::to_string(port) + ": " + std::strerror(probe));
  }
  if (port == 0) {
    impl_->port = impl_->http.bind_to_any_port(host);
    if (impl_->port <= 0) throw_value_error("[ui] cannot listen on " + host + " (any port)");
  } else {
    if (!impl_->http.bind_to_port(host, port)) {
      throw_value_error("[ui] cannot listen on " + host + ":" + std::to_string(port) +
                        " (is the port already in use?)");
    }
    impl_->port = port;
  }
  detail::raise_listen_backlog(impl_->listening_socket);
}

int Server::port() const { return impl_->port; }
const std::string& Server::token() const { return impl_->token; }
const std::string& Server::workspace() const { return impl_->workspace; }

std::string Server::url() const {
  const std::string& host = impl_->options.host;
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  std::string url = "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(impl_->port) + "/";
  if (!impl_->token.empty()) url += "?token=" + impl_->token;
  return url;
}

void Server::listen() { impl_->http.listen_after_bind(); }

void Server::stop() {
  // A step profile still running is killed: stopping must not wait for its timeout.
  if (impl_->plans) impl_->plans->cancel();
  if (impl_->http.is_running()) impl_->http.stop();
}

}  // namespace remat::ui
