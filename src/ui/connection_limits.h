#pragma once
// How many connections the server serves at once, how long an idle one may hold a worker, and
// how many may wait to be accepted.

#include <httplib.h>

namespace remat::ui::detail {

/// Sets `http`'s worker threads, keep-alive and read timeouts (connection_limits.cpp says why
/// each value).
void apply_connection_limits(httplib::Server& http);

/// Raises the backlog of `listening_socket` (bound and listening; -1: nothing to do) to the
/// system's maximum, SOMAXCONN.
void raise_listen_backlog(int listening_socket);

}  // namespace remat::ui::detail
