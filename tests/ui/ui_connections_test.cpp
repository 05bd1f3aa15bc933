// The server's connections: a server stopped after serving requests can be started again on its
// port at once.
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "remat/ui/server.h"
#include "ui_server_fixture.h"

namespace {
namespace ui_connections_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)
using remat::testing::TempDir;
using remat::testing::UiServer;

// The connections of /proc/net/tcp in TIME_WAIT (state 06) whose local port is `port`.
int time_wait_connections_on(int port) {
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // the header
  int count = 0;
  while (std::getline(tcp, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    const size_t colon = local.find(':');
    if (colon != std::string::npos && std::stoi(local.substr(colon + 1), nullptr, 16) == port && state == "06") {
      ++count;
    }
  }
  return count;
}

// Requests the server answers and then closes leave its side of each connection in TIME_WAIT
// (RFC 9293, section 3.6.1: the side that closes first); a new server binds the port at once
// all the same, and serves.
TEST(UiConnectionsTest, ARestartOnTheSamePortRightAfterServingRequestsBinds) {
  TempDir dir("remat_ui_restart");
  remat::ui::ServerOptions o;
  o.workspace = dir.str();
  int port = 0;
  {
    UiServer ui(o);
    port = ui.port();
    for (int i = 0; i < 3; ++i) {
      const std::string answer = remat::testing::raw_exchange(
          port, "GET /api/options HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
      EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer.substr(0, 200);
    }
  }
  EXPECT_GT(time_wait_connections_on(port), 0) << "no connection in TIME_WAIT: the restart proves less";
  o.port = port;
  o.remat_executable = remat::testing::cli_path();
  remat::ui::Server again(o);
  try {
    again.bind();
  } catch (const c10::ValueError& e) {
    FAIL() << e.what_without_backtrace();
  }
  std::thread serving([&again] { again.listen(); });
  std::optional<int> status;
  for (int i = 0; i < 200 && !status; ++i) {
    if (auto r = httplib::Client("127.0.0.1", port).Get("/api/options")) status = r->status;
    if (!status) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  again.stop();
  serving.join();
  EXPECT_EQ(status, 200);
}

}  // namespace ui_connections_test
}  // namespace
