// A run of the real `remat` binary started through the API on tiny demo data (flux-tiny, the
// latent-cache demo dataset of the trainer's tests), its progress, metrics and log streamed,
// stopped with SIGINT, its checkpoint saved; its files served, confined to the output folder.
#include <filesystem>

#include <gtest/gtest.h>

#include "remat/train/data/data.h"
#include "remat/train/family/family.h"
#include "ui_server_fixture.h"
#include "flux_tiny_dataset.h"

namespace {
namespace ui_runs_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)
namespace fs = std::filesystem;
using nlohmann::json;
using remat::testing::body_json;
using remat::testing::kUiHeader;
using remat::testing::TempDir;
using remat::testing::UiServer;

json wait_for(httplib::Client& c, const std::string& path, const std::function<bool(const json&)>& done,
              double timeout_s = 120) {
  const auto start = std::chrono::steady_clock::now();
  json last;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < timeout_s) {
    last = body_json(c.Get(path));
    if (done(last)) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "timed out waiting on " << path << ": " << last.dump();
  return last;
}

TEST(UiRunsTest, ARunIsStartedStreamedAndStoppedWithItsCheckpointSaved) {
  TempDir dir("remat_ui_runs");
  remat::testing::make_flux_tiny_dataset(dir / "data", 16);

  remat::ui::ServerOptions o;
  o.workspace = dir.str();
  UiServer ui(o);
  auto c = ui.client();
  // Relative paths: the run starts in the workspace. Far more steps than the test waits for.
  const json config = {{"model_family", "flux"},     {"model_flavour", "flux-tiny"}, {"model_type", "lora"},
                       {"lora_rank", 4},             {"instance_data_dir", "data"},  {"output_dir", "out/tiny"},
                       {"train_batch_size", 2},      {"learning_rate", 1e-2},        {"lr_scheduler", "constant"},
                       {"mixed_precision", "no"},    {"max_train_steps", 100000},    {"checkpoint_step_interval", 0},
                       {"resume_from_checkpoint", "none"}, {"seed", 3},              {"torch_num_threads", 1},
                       {"report_every", 1},          {"device", "cpu"}};
  ASSERT_EQ(c.Put("/api/configs/tiny", kUiHeader, json{{"config", config}}.dump(), "application/json")->status, 200);

  // An invalid config is refused with its errors, and starts nothing.
  json broken = config;
  broken["gradient_checkpointing_interval"] = 0;
  ASSERT_EQ(c.Put("/api/configs/broken", kUiHeader, json{{"config", broken}}.dump(), "application/json")->status, 200);
  auto refused = c.Post("/api/runs", kUiHeader, R"({"config_name": "broken"})", "application/json");
  EXPECT_EQ(refused->status, 400);
  EXPECT_EQ(body_json(refused)["errors"][0]["option"], "gradient_checkpointing_interval");
  EXPECT_EQ(c.Post("/api/runs", kUiHeader, R"({"config_name": "missing"})", "application/json")->status, 404);

  auto started = c.Post("/api/runs", kUiHeader, R"({"config_name": "tiny"})", "application/json");
  ASSERT_EQ(started->status, 201) << started->body;
  const json run = body_json(started);
  const std::string id = run["id"];
  EXPECT_EQ(run["state"], "running");
  EXPECT_EQ(run["max_steps"], 100000);
  EXPECT_EQ(run["output_dir"], (fs::canonical(dir.path()) / "out/tiny").string());
  const std::string base = "/api/runs/" + id;

  // Progress: three steps recorded, then an ETA from their times.
  json status = wait_for(c, base, [](const json& s) { return s["step"].get<int64_t>() >= 3 || s["state"] != "running"; });
  ASSERT_EQ(status["state"], "running") << status.dump();
  EXPECT_GT(status["peak_bytes"].get<int64_t>(), 0);
  EXPECT_GT(status["eta_seconds"].get<double>(), 0.0);
  json list = body_json(c.Get("/api/runs"));
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["id"], id);

  // Metrics from line N: the records after it, steps 1, 2, 3 ... in order.
  json all = body_json(c.Get(base + "/metrics?from=0"));
  ASSERT_GE(all["records"].size(), 3u);
  for (size_t i = 0; i < all["records"].size(); ++i) {
    EXPECT_EQ(all["records"][i]["step"].get<int64_t>(), static_cast<int64_t>(i + 1));
    EXPECT_TRUE(all["records"][i].contains("loss"));
  }
  EXPECT_EQ(all["next"].get<size_t>(), all["records"].size());
  json later = body_json(c.Get(base + "/metrics?from=2"));
  ASSERT_FALSE(later["records"].empty());
  EXPECT_EQ(later["records"][0]["step"], 3);
  EXPECT_EQ(c.Get(base + "/metrics?from=-1")->status, 400);

  json log = body_json(c.Get(base + "/log?from=0"));
  ASSERT_FALSE(log["lines"].empty());
  std::string text;
  for (const auto& line : log["lines"]) text += line.get<std::string>() + "\n";
  EXPECT_NE(text.find("[train]"), std::string::npos) << text;

  // Stop: SIGINT, the trainer saves a checkpoint after the current step and exits with 130.
  auto stop = c.Post(base + "/stop", kUiHeader, "", "application/json");
  ASSERT_EQ(stop->status, 200);
  EXPECT_TRUE(body_json(stop)["stop_sent"].get<bool>());
  status = wait_for(c, base, [](const json& s) { return s["state"] != "running"; });
  EXPECT_EQ(status["state"], "stopped") << status.dump();
  EXPECT_EQ(status["exit_code"], 130);
  ASSERT_EQ(status["checkpoints"].size(), 1u) << status.dump();
  const std::string checkpoint = status["checkpoints"][0];
  EXPECT_EQ(checkpoint, "checkpoint-" + std::to_string(status["step"].get<int64_t>()));
  EXPECT_TRUE(fs::is_directory(dir / ("out/tiny/" + checkpoint)));
  json final_log = body_json(c.Get(base + "/log?from=0"));
  text.clear();
  for (const auto& line : final_log["lines"]) text += line.get<std::string>() + "\n";
  EXPECT_NE(text.find("interrupted"), std::string::npos) << text;
  EXPECT_TRUE(fs::exists(dir / ("runs/" + id + "/log.txt")));
  EXPECT_EQ(json::parse(remat::testing::read_file(dir / ("runs/" + id + "/run.json")))["state"], "stopped");

  // The run's files: served from its output_dir; traversal and symlinks out refused.
  auto metrics_file = c.Get(base + "/files/metrics.jsonl");
  ASSERT_EQ(metrics_file->status, 200);
  EXPECT_EQ(metrics_file->body, remat::testing::read_file(dir / "out/tiny/metrics.jsonl"));
  TempDir outside("remat_ui_runs_outside");
  std::ofstream(outside / "secret.txt") << "secret";
  fs::create_symlink(outside / "secret.txt", dir / "out/tiny/link.txt");
  std::ofstream(dir / "out/sibling.txt") << "secret";
  for (const std::string path : {"../sibling.txt", "%2e%2e/sibling.txt", "%2E%2E%2Fsibling.txt",
                                 "%252e%252e/sibling.txt", "..%5csibling.txt", "/etc/passwd",
                                 "%2Fetc%2Fpasswd", "link.txt", "./metrics.jsonl", "nothing.png"}) {
    auto r = c.Get(base + "/files/" + path);
    ASSERT_TRUE(r) << path;
    EXPECT_GE(r->status, 400) << path;
    EXPECT_EQ(r->body.find("secret"), std::string::npos) << path;
  }
  EXPECT_EQ(c.Get("/api/runs/nope")->status, 404);

  // A run that reaches its last step: finished, exit code 0, one metrics record per step.
  json short_config = config;
  short_config["max_train_steps"] = 3;
  short_config["output_dir"] = "out/short";
  ASSERT_EQ(c.Put("/api/configs/short", kUiHeader, json{{"config", short_config}}.dump(), "application/json")->status,
            200);
  auto short_run = c.Post("/api/runs", kUiHeader, R"({"config_name": "short"})", "application/json");
  ASSERT_EQ(short_run->status, 201) << short_run->body;
  const std::string short_base = "/api/runs/" + body_json(short_run)["id"].get<std::string>();
  const json done = wait_for(c, short_base, [](const json& s) { return s["state"] != "running"; });
  EXPECT_EQ(done["state"], "finished") << done.dump();
  EXPECT_EQ(done["exit_code"], 0);
  EXPECT_EQ(done["step"], 3);
  EXPECT_EQ(done["max_steps"], 3);
  EXPECT_EQ(body_json(c.Get(short_base + "/metrics?from=0"))["records"].size(), 3u);
  EXPECT_EQ(body_json(c.Get("/api/runs")).size(), 2u);

  // A later server on the workspace lists both runs as they ended, and serves their logs.
  remat::ui::ServerOptions again;
  again.workspace = dir.str();
  UiServer later_ui(again);
  auto later_client = later_ui.client();
  const json history = body_json(later_client.Get("/api/runs"));
  ASSERT_EQ(history.size(), 2u) << history.dump();
  std::map<std::string, json> by_id;
  for (const auto& r : history) by_id[r["id"].get<std::string>()] = r;
  EXPECT_EQ(by_id[id]["state"], "stopped");
  EXPECT_EQ(by_id[id]["exit_code"], 130);
  EXPECT_EQ(by_id[id]["config_name"], "tiny");
  EXPECT_EQ(by_id[body_json(short_run)["id"].get<std::string>()]["state"], "finished");
  EXPECT_FALSE(body_json(later_client.Get(base + "/log?from=0"))["lines"].empty());
  EXPECT_FALSE(body_json(c.Post(base + "/stop", kUiHeader, "", "application/json"))["stop_sent"].get<bool>());
}

}  // namespace ui_runs_test
}  // namespace
