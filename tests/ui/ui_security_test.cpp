// The server's security: the token off loopback, the CSRF header, the Host check (a missing Host
// included), confinement of file paths (.., encoded forms, absolute paths, symlinks out), the
// body limit, a busy port.
#include <ifaddrs.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "remat/ui/server.h"
#include "ui_server_fixture.h"

namespace {
namespace ui_security_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)
namespace fs = std::filesystem;
using nlohmann::json;
using remat::testing::body_json;
using remat::testing::kUiHeader;
using remat::testing::TempDir;
using remat::testing::UiServer;

TEST(UiSecurityTest, LoopbackNamesAreRecognised) {
  EXPECT_TRUE(remat::ui::is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(remat::ui::is_loopback_host("127.3.2.1"));
  EXPECT_TRUE(remat::ui::is_loopback_host("localhost"));
  EXPECT_TRUE(remat::ui::is_loopback_host("::1"));
  EXPECT_FALSE(remat::ui::is_loopback_host("0.0.0.0"));
  EXPECT_FALSE(remat::ui::is_loopback_host("192.168.1.2"));
  EXPECT_FALSE(remat::ui::is_loopback_host("128.0.0.1"));
}

// Bound to 0.0.0.0: no token or a wrong one is refused on every endpoint; the right one, as a
// bearer header or ?token= (which sets the cookie the page's files then carry), is accepted.
TEST(UiSecurityTest, OffLoopbackEveryRequestNeedsTheToken) {
  TempDir dir("remat_ui_token");
  remat::ui::ServerOptions o;
  o.host = "0.0.0.0";
  o.workspace = dir.str();
  UiServer ui(o);
  const std::string token = ui.server().token();
  ASSERT_EQ(token.size(), 64u);
  EXPECT_NE(ui.server().url().find("?token=" + token), std::string::npos);
  auto c = ui.client();
  for (const std::string path : {"/", "/api/options", "/api/configs", "/api/runs"}) {
    auto none = c.Get(path);
    ASSERT_TRUE(none);
    EXPECT_EQ(none->status, 401) << path;
    auto wrong = c.Get(path, {{"Authorization", "Bearer " + std::string(64, '0')}});
    EXPECT_EQ(wrong->status, 401) << path;
    auto right = c.Get(path, {{"Authorization", "Bearer " + token}});
    EXPECT_EQ(right->status, 200) << path;
  }
  EXPECT_EQ(c.Get("/api/options?token=nope")->status, 401);
  auto first_load = c.Get("/?token=" + token);
  EXPECT_EQ(first_load->status, 200);
  const std::string cookie = first_load->get_header_value("Set-Cookie");
  EXPECT_NE(cookie.find("remat_ui_token=" + token), std::string::npos);
  EXPECT_NE(cookie.find("HttpOnly"), std::string::npos);
  EXPECT_EQ(c.Get("/api/options", {{"Cookie", "remat_ui_token=" + token}})->status, 200);
  // State changes need the token too, even with the CSRF header.
  auto put = c.Put("/api/configs/x", kUiHeader, R"({"config": {}})", "application/json");
  EXPECT_EQ(put->status, 401);
  EXPECT_FALSE(fs::exists(dir / "configs/x"));

  // The same through a non-loopback address of this machine, when it has one.
  ifaddrs* addrs = nullptr;
  std::string local;
  if (getifaddrs(&addrs) == 0) {
    for (ifaddrs* a = addrs; a; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
      char text[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
      if (!remat::ui::is_loopback_host(text)) local = text;
    }
    freeifaddrs(addrs);
  }
  if (!local.empty()) {
    httplib::Client remote(local, ui.port());
    EXPECT_EQ(remote.Get("/api/options")->status, 401) << local;
    EXPECT_EQ(remote.Get("/api/options", {{"Authorization", "Bearer " + token}})->status, 200) << local;
  }
}

TEST(UiSecurityTest, LoopbackNeedsNoTokenButALoopbackHostAndTheHeaderToChangeState) {
  TempDir dir("remat_ui_csrf");
  remat::ui::ServerOptions o;
  o.workspace = dir.str();
  UiServer ui(o);
  EXPECT_TRUE(ui.server().token().empty());
  auto c = ui.client();
  EXPECT_EQ(c.Get("/api/options")->status, 200);
  // DNS rebinding: a page of evil.example resolving to 127.0.0.1.
  EXPECT_EQ(c.Get("/api/options", {{"Host", "evil.example:8080"}})->status, 403);
  EXPECT_EQ(c.Get("/api/options", {{"Host", "localhost:9000"}})->status, 200);
  const std::string body = R"({"config": {"lora_rank": 4}})";
  for (const auto& headers : {httplib::Headers{}, httplib::Headers{{"X-Remat-UI", "0"}}}) {
    EXPECT_EQ(c.Put("/api/configs/x", headers, body, "application/json")->status, 403);
    EXPECT_EQ(c.Post("/api/validate", headers, body, "application/json")->status, 403);
    EXPECT_EQ(c.Post("/api/runs", headers, R"({"config_name": "x"})", "application/json")->status, 403);
  }
  EXPECT_FALSE(fs::exists(dir / "configs/x"));
  EXPECT_EQ(c.Put("/api/configs/x", kUiHeader, body, "application/json")->status, 200);
}

// A request without a Host header names no host to check: refused on loopback, saying why
// (httplib's client always sends one, so these go over a raw connection).
TEST(UiSecurityTest, OnLoopbackARequestWithoutHostIsRefused) {
  TempDir dir("remat_ui_no_host");
  remat::ui::ServerOptions o;
  o.workspace = dir.str();
  UiServer ui(o);
  for (const std::string request : {"GET /api/options HTTP/1.0\r\n\r\n",
                                    "GET /api/options HTTP/1.1\r\nConnection: close\r\n\r\n",
                                    "GET / HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n"}) {
    const std::string answer = remat::testing::raw_exchange(ui.port(), request);
    EXPECT_EQ(answer.rfind("HTTP/1.1 403", 0), 0u) << request << answer.substr(0, 200);
    const size_t body = answer.find("\r\n\r\n");
    const std::string error = remat::testing::error_of(body == std::string::npos ? "" : answer.substr(body + 4));
    EXPECT_EQ(error.rfind("[ui] the request has no Host header", 0), 0u) << error;
    EXPECT_NE(error.find("HTTP/1.1 requires one"), std::string::npos) << error;
  }
  const std::string with_host = remat::testing::raw_exchange(
      ui.port(), "GET /api/options HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(with_host.rfind("HTTP/1.1 200", 0), 0u) << with_host.substr(0, 200);
}

TEST(UiSecurityTest, OversizedBodiesAreRefused) {
  TempDir dir("remat_ui_body");
  remat::ui::ServerOptions o;
  o.workspace = dir.str();
  o.max_body_bytes = 4096;
  UiServer ui(o);
  auto c = ui.client();
  const json big = {{"config", {{"instance_prompt", std::string(8192, 'a')}}}};
  auto r = c.Put("/api/configs/big", kUiHeader, big.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_FALSE(fs::exists(dir / "configs/big/config.json"));
  const json small = {{"config", {{"instance_prompt", std::string(1024, 'a')}}}};
  EXPECT_EQ(c.Put("/api/configs/big", kUiHeader, small.dump(), "application/json")->status, 200);
}

TEST(UiSecurityTest, ASecondServerOnABusyPortSaysSo) {
  TempDir dir("remat_ui_busy");
  remat::ui::ServerOptions o;
  o.workspace = dir.str();
  UiServer ui(o);
  remat::ui::ServerOptions again = o;
  again.port = ui.port();
  remat::ui::Server second(again);
  try {
    second.bind();
    FAIL() << "bound a busy port";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("already in use"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(ui.port())), std::string::npos) << e.what();
  }
}

// Config names and run files: "..", its percent-encoded and double-encoded forms, absolute paths
// and symlinks leading out are refused; nothing outside the workspace is read or written.
TEST(UiSecurityTest, PathsAreConfinedToTheWorkspace) {
  TempDir outside("remat_ui_outside");
  TempDir dir("remat_ui_confine");
  remat::testing::TempDir* secret_dir = &outside;
  std::ofstream(*secret_dir / "secret.txt") << "secret";
  // A config whose folder is a symlink out of the workspace.
  fs::create_directories(dir / "configs");
  fs::create_directory_symlink(outside.path(), dir / "configs/escape");
  std::ofstream(outside / "config.json") << "{}";
  remat::ui::ServerOptions o;
  o.workspace = dir.str();
  UiServer ui(o);
  auto c = ui.client();
  for (const std::string path :
       {"/api/configs/..", "/api/configs/%2e%2e", "/api/configs/%2E%2E", "/api/configs/%252e%252e",
        "/api/configs/..%2fconfigs", "/api/configs/escape", "/api/configs/%2Fetc%2Fpasswd"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_GE(r->status, 400) << path;
    EXPECT_EQ(r->body.find("secret"), std::string::npos) << path;
  }
  auto list = body_json(c.Get("/api/configs"));
  EXPECT_TRUE(list.empty()) << list.dump();  // the symlinked folder is not listed
  auto put = c.Put("/api/configs/escape", kUiHeader, R"({"config": {"lora_rank": 7}})", "application/json");
  EXPECT_GE(put->status, 400);
  EXPECT_EQ(remat::testing::read_file(outside / "config.json"), "{}");
}

}  // namespace ui_security_test
}  // namespace
