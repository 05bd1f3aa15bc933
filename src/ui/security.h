#pragma once
// Who may use the server and how (Note [UI security] in security.cpp).

#include <optional>
#include <string>

#include <httplib.h>

namespace remat::ui::detail {

/// 32 random bytes from /dev/urandom as 64 hex digits. Throws c10::Error when it cannot be read.
std::string random_token();

/// Equal strings, compared in time independent of where they differ.
bool constant_time_equal(const std::string& a, const std::string& b);

/// The token a request carries: `Authorization: Bearer <t>`, the `token` query parameter, or the
/// remat_ui_token cookie the page's first load sets; empty when none.
std::string request_token(const httplib::Request& req);

/// Whether the Host header names a loopback host (localhost, 127.x, [::1]) on any port; false
/// without one.
bool host_header_is_loopback(const httplib::Request& req);

/// Why `req` must be refused, as {status, message}; nullopt when it may proceed.
/// `token` empty: the server is on loopback and checks the Host header instead.
struct Refusal {
  int status;
  std::string message;
};
std::optional<Refusal> check_request(const httplib::Request& req, const std::string& token);

}  // namespace remat::ui::detail
