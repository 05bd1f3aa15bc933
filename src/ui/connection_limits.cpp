#include "connection_limits.h"

#include <sys/socket.h>

namespace remat::ui::detail {
namespace {

// cpp-httplib serves each connection on one worker of its task queue from accept to close,
// waiting up to the keep-alive timeout for each next request (Server::new_task_queue,
// set_keep_alive_timeout). Its defaults, 8 workers (CPPHTTPLIB_THREAD_POOL_COUNT) and 5 s
// (CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND), let 8 connections that send nothing stall every request
// for 5 s, and 40 for 24 s. A browser keeps up to 6 connections per host and opens some ahead of
// need; a POST /api/plan holds its worker while its step profile runs.
//  - 64 workers: 40 idle connections leave most of them free. Idle workers cost a reserved
//    stack each, no CPU.
constexpr size_t kWorkerThreads = 64;
//  - An idle connection gives its worker back after 1 s (the smallest keep-alive timeout
//    httplib takes: whole seconds); a connection queued behind more than 64 idle ones waits
//    about 1 s for each 64 ahead of it (the queue is first in, first out).
constexpr time_t kKeepAliveTimeoutSeconds = 1;
//  - A connection gives its worker back after 10 requests even when busy, so that a client
//    polling without pause cannot keep one for ever (the page polls once a second).
constexpr size_t kKeepAliveMaxRequests = 10;
//  - A request that has started must keep arriving: 2 s without a byte ends it
//    (set_read_timeout, applied to each read).
constexpr time_t kReadTimeoutSeconds = 2;

}  // namespace

void raise_listen_backlog(int listening_socket) {
  // cpp-httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into the
  // library): in a burst of connections beyond it (a browser opens 6 to load a page), the kernel
  // drops SYNs (ListenOverflows in nstat) and the client sends them again a second later. On
  // Linux, listen(2) on a listening socket sets its backlog anew (inet_listen).
  if (listening_socket >= 0) ::listen(listening_socket, SOMAXCONN);
}

void apply_connection_limits(httplib::Server& http) {
  http.new_task_queue = [] { return new httplib::ThreadPool(kWorkerThreads); };
  http.set_keep_alive_timeout(kKeepAliveTimeoutSeconds);
  http.set_keep_alive_max_count(kKeepAliveMaxRequests);
  http.set_read_timeout(kReadTimeoutSeconds, 0);
}

}  // namespace remat::ui::detail
