// The server's connections: idle ones do not keep requests waiting, and a server stopped after
// serving requests can be started again on its port at once.
#include <unistd.h>

#include <fstream>
#include <future>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "remat/ui/server.h"
#include "ui_server_fixture.h"

namespace {
namespace ui_connections_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)
using nlohmann::json;
using remat::testing::connect_loopback;
using remat::testing::kUiHeader;
using remat::testing::TempDir;
using remat::testing::UiServer;

// A client that gives up after 1 s: a request it answers was answered within 1 s.
httplib::Client impatient_client(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(1, 0);
  c.set_write_timeout(1, 0);
  return c;
}

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

// Forty connections that send nothing, and a POST /api/plan of the largest default shape
// (flux-tiny at resolution 1024, batch 4, 512 text tokens) at the same time: a GET of the page
// and of the API is still answered within 1 s, and the plan with a [ui] error.
TEST(UiConnectionsTest, FortyIdleConnectionsAndAHugePlanKeepNoGetWaiting) {
  TempDir dir("remat_ui_idle");
  remat::ui::ServerOptions o;
  o.workspace = dir.str();
  // Where nothing is predicted (LibTorch 2.x), the profile's child is stopped at 256 MiB, not 2 GiB.
  o.plan_memory_limit_bytes = int64_t{256} << 20;
  UiServer ui(o);
  auto huge_plan = std::async(std::launch::async, [&ui] {
    auto c = ui.client();
    const json config = {{"model_family", "flux"}, {"model_flavour", "flux-tiny"}, {"resolution", 1024},
                         {"train_batch_size", 4}, {"tokenizer_max_length", 512}};
    auto r = c.Post("/api/plan", kUiHeader, json{{"config", config}}.dump(), "application/json");
    return r ? std::make_pair(r->status, r->body) : std::make_pair(-1, std::string());
  });
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) {
    const int fd = connect_loopback(ui.port());
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
  }
  // Every idle connection has reached the server's accept queue before the GETs below.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto c = impatient_client(ui.port());
  for (const std::string path : {"/", "/api/options", "/api/configs"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << "GET " << path << " was not answered within 1 s with 40 idle connections open";
    EXPECT_EQ(r->status, 200) << path;
  }
  for (int fd : idle) ::close(fd);
  const auto [status, body] = huge_plan.get();
  // With LibTorch 1.13, refused before it starts: its attention scores alone take 4 layers x
  // batch 4 x 2 heads x 4608^2 tokens x 4 bytes = 2.53 GiB.
  EXPECT_EQ(status, 422) << body;
  EXPECT_EQ(remat::testing::error_of(body).rfind("[ui] ", 0), 0u) << body;
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
