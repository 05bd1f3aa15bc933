#include "security.h"

#include <fcntl.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <c10/util/Exception.h>

#include "remat/ui/server.h"

// Note [UI security]
// The server starts training runs and writes files, so a request must come from the person who
// started it:
//  - Loopback by default. There, anyone on the machine may connect (as with Jupyter's default
//    without a token); a web page elsewhere cannot, except through DNS rebinding (evil.example
//    resolving to 127.0.0.1), so the Host header must be a loopback name or address; a request
//    without one is refused too (HTTP/1.1 requires it, and it would escape the check).
//  - Bound to any other address, every request needs the token printed at start: a bearer
//    header, `?token=` (the first page load), or the cookie that load sets (the page's own
//    scripts and styles, the gallery's images). The cookie is HttpOnly and SameSite=Strict.
//  - POST/PUT/DELETE need `X-Remat-UI: 1`: an HTML form or a cross-site fetch without CORS
//    preflight cannot set a custom header (and no CORS header is ever sent), so a page
//    elsewhere cannot make the browser start a run with the user's cookie.
//  - Paths from requests are confined to the workspace (workspace.cpp), bodies are bounded
//    (ServerOptions::max_body_bytes).

namespace remat::ui {

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return false;
}

namespace detail {

std::string random_token() {
  unsigned char bytes[32];
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "[ui] cannot open /dev/urandom for the access token");
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::read(fd, bytes + got, sizeof(bytes) - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  TORCH_CHECK(got == sizeof(bytes), "[ui] cannot read /dev/urandom for the access token");
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string request_token(const httplib::Request& req) {
  const std::string auth = req.get_header_value("Authorization");
  const std::string bearer = "Bearer ";
  if (auth.compare(0, bearer.size(), bearer) == 0) return auth.substr(bearer.size());
  if (req.has_param("token")) return req.get_param_value("token");
  const std::string cookies = req.get_header_value("Cookie");
  const std::string key = "remat_ui_token=";
  size_t pos = 0;
  while ((pos = cookies.find(key, pos)) != std::string::npos) {
    if (pos == 0 || cookies[pos - 1] == ' ' || cookies[pos - 1] == ';') {
      const size_t begin = pos + key.size();
      const size_t end = cookies.find(';', begin);
      return cookies.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    }
    pos += key.size();
  }
  return "";
}

bool host_header_is_loopback(const httplib::Request& req) {
  std::string host = req.get_header_value("Host");
  if (host.empty()) return false;  // nothing names this machine (check_request says why it is refused)
  if (host.front() == '[') {
    const size_t close = host.find(']');
    host = close == std::string::npos ? host : host.substr(0, close + 1);
  } else {
    host = host.substr(0, host.find(':'));
  }
  return is_loopback_host(host);
}

std::optional<Refusal> check_request(const httplib::Request& req, const std::string& token) {
  if (token.empty()) {
    if (req.get_header_value("Host").empty()) {
      return Refusal{403, "[ui] the request has no Host header (HTTP/1.1 requires one, RFC 9112 section 3.2); "
                          "on loopback it must name this machine's loopback address (localhost, 127.0.0.1 "
                          "or [::1])"};
    }
    if (!host_header_is_loopback(req)) {
      return Refusal{403, "[ui] the Host header must name this machine's loopback address (localhost, "
                          "127.0.0.1 or [::1]); got '" + req.get_header_value("Host") + "'"};
    }
  } else {
    const std::string given = request_token(req);
    if (given.empty()) {
      return Refusal{401, "[ui] this server is not on loopback: every request needs the token printed "
                          "at start (Authorization: Bearer <token>, or ?token=<token>)"};
    }
    if (!constant_time_equal(given, token)) return Refusal{401, "[ui] wrong token"};
  }
  const bool changes_state = req.method == "POST" || req.method == "PUT" || req.method == "DELETE" ||
                             req.method == "PATCH";
  if (changes_state && req.get_header_value("X-Remat-UI") != "1") {
    return Refusal{403, "[ui] " + req.method + " requests need the header 'X-Remat-UI: 1' (a cross-site "
                        "form cannot send it)"};
  }
  return std::nullopt;
}

}  // namespace detail
}  // namespace remat::ui
