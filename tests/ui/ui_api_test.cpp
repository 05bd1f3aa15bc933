// The JSON API over HTTP: the page files, the options registry, validation, the planner's
// figures and configs in the workspace.
#include <filesystem>

#include <gtest/gtest.h>

#include "remat/train/options/options.h"
#include "ui_server_fixture.h"
#include "test_paths.h"

namespace {
namespace ui_api_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)
namespace fs = std::filesystem;
using nlohmann::json;
using remat::testing::body_json;
using remat::testing::kUiHeader;
using remat::testing::read_file;
using remat::testing::TempDir;
using remat::testing::UiServer;

class UiApiTest : public ::testing::Test {
 protected:
  remat::ui::ServerOptions options() {
    remat::ui::ServerOptions o;
    o.workspace = dir_.str();
    return o;
  }
  TempDir dir_{"remat_ui_api"};
};

// Every file of src/ui/assets is served byte for byte from the binary; "/" is index.html.
TEST_F(UiApiTest, ServesEveryPageFileAsInTheSources) {
  UiServer ui(options());
  auto c = ui.client();
  const std::string assets = remat::testing::source_dir() + "/src/ui/assets";
  auto root = c.Get("/");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->status, 200);
  EXPECT_EQ(root->body, read_file(assets + "/index.html"));
  EXPECT_NE(root->get_header_value("Content-Type").find("text/html"), std::string::npos);
  int served = 0;
  for (const auto& entry : fs::directory_iterator(assets)) {
    const std::string name = entry.path().filename().string();
    auto r = c.Get("/" + name);
    ASSERT_TRUE(r) << name;
    EXPECT_EQ(r->status, 200) << name;
    EXPECT_EQ(r->body, read_file(entry.path().string())) << name;
    ++served;
  }
  EXPECT_GE(served, 1);
  EXPECT_EQ(c.Get("/no-such-file.js")->status, 404);
  // The embedded translations are not page files.
  EXPECT_EQ(c.Get("/help/OPTIONS.zh.md")->status, 404);
}

// /api/options is `remat options --json` plus the languages; each translated help line is the
// one in docs/OPTIONS.<lang>.md (read here line by line, independently of the server's parser).
TEST_F(UiApiTest, OptionsAreTheRegistryPlusSixLanguages) {
  UiServer ui(options());
  auto c = ui.client();
  json got = body_json(c.Get("/api/options"));
  ASSERT_TRUE(got.is_object());
  json languages = got["languages"];
  got.erase("languages");
  EXPECT_EQ(got, json::parse(remat::train::options_json()));
  ASSERT_EQ(languages.size(), 6u);
  std::vector<std::string> codes;
  for (const auto& l : languages) codes.push_back(l["code"]);
  EXPECT_EQ(codes, (std::vector<std::string>{"en", "zh", "ja", "es", "pt-BR", "hi"}));
  EXPECT_EQ(languages[0]["options"]["gradient_checkpointing_interval"]["help"],
            remat::train::find_option("gradient_checkpointing_interval")->help);
  for (size_t i = 1; i < languages.size(); ++i) {
    const std::string code = languages[i]["code"];
    std::istringstream doc(read_file(remat::testing::source_dir() + "/docs/OPTIONS." + code + ".md"));
    std::string line;
    while (std::getline(doc, line) && line != "### `--gradient_checkpointing_interval`") {}
    std::vector<std::string> bullets;
    while (std::getline(doc, line) && line.rfind("###", 0) != 0) {
      if (line.rfind("- **", 0) == 0) bullets.push_back(line);
    }
    ASSERT_GE(bullets.size(), 4u) << code;
    const std::string help = languages[i]["options"]["gradient_checkpointing_interval"]["help"];
    ASSERT_FALSE(help.empty()) << code;
    // The third line ("What") ends with the help text.
    EXPECT_EQ(bullets[2].substr(bullets[2].size() - help.size()), help) << code;
    for (const auto& spec : remat::train::option_specs()) {
      if (spec.checkpointing) {
        EXPECT_TRUE(languages[i]["options"].contains(spec.name)) << code << " " << spec.name;
      }
    }
  }
}

TEST_F(UiApiTest, ValidationReportsEachProblemAtItsOption) {
  UiServer ui(options());
  auto c = ui.client();
  auto validate = [&c](const json& config) {
    auto r = c.Post("/api/validate", kUiHeader, json{{"config", config}}.dump(), "application/json");
    EXPECT_TRUE(r);
    return body_json(r);
  };
  json ok = validate({{"model_family", "flux"}, {"model_flavour", "flux-tiny"}, {"gradient_checkpointing_interval", 2}});
  EXPECT_TRUE(ok["errors"].empty()) << ok.dump();

  json bad = validate({{"gradient_checkpointing_interval", 0}, {"learning_rate", "fast"}, {"lora_rnak", 4}});
  std::set<std::string> options;
  for (const auto& e : bad["errors"]) {
    options.insert(e["option"].get<std::string>());
    EXPECT_FALSE(e["message"].get<std::string>().empty());
  }
  EXPECT_TRUE(options.count("gradient_checkpointing_interval")) << bad.dump();
  EXPECT_TRUE(options.count("learning_rate")) << bad.dump();
  EXPECT_TRUE(options.count("lora_rnak")) << bad.dump();

  // stride < interval: the relation rule, at the stride.
  json relation = validate({{"gradient_checkpointing_interval", 4}, {"gradient_checkpointing_segment_stride", 2}});
  ASSERT_FALSE(relation["errors"].empty());
  EXPECT_EQ(relation["errors"][0]["option"], "gradient_checkpointing_segment_stride");

  // An option whose switch is off: a warning at that option, not an error.
  json dependent = validate({{"gradient_checkpointing", false}, {"gradient_checkpointing_interval", 2}});
  EXPECT_TRUE(dependent["errors"].empty()) << dependent.dump();
  bool warned = false;
  for (const auto& w : dependent["warnings"]) warned |= w["option"] == "gradient_checkpointing_interval";
  EXPECT_TRUE(warned) << dependent.dump();

  auto not_json = c.Post("/api/validate", kUiHeader, "{not json", "application/json");
  EXPECT_EQ(not_json->status, 400);
  EXPECT_TRUE(body_json(not_json).contains("error"));
}

// The planner's figures: no checkpointing is the step-time baseline (factor 1); checkpointing
// every block lowers the peak and costs time; interval 2 lies between; auto fits a budget.
TEST_F(UiApiTest, PlanGivesPeakAndStepFactorOfTheLayoutAndWhatAutoPicks) {
  UiServer ui(options());
  auto c = ui.client();
  const json base = {{"model_family", "flux"},  {"model_flavour", "flux-tiny"}, {"model_type", "full"},
                     {"resolution", 128},       {"resolution_type", "pixel"},   {"tokenizer_max_length", 16},
                     {"train_batch_size", 2},   {"mixed_precision", "no"}};
  auto plan = [&c, &base](const json& extra, std::optional<int64_t> budget = std::nullopt) {
    json config = base;
    config.update(extra);
    json body = {{"config", config}};
    if (budget) body["budget_bytes"] = *budget;
    auto r = c.Post("/api/plan", kUiHeader, body.dump(), "application/json");
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    return body_json(r);
  };
  const json off = plan({{"gradient_checkpointing", false}});
  const json every = plan({{"gradient_checkpointing", true}});
  const json two = plan({{"gradient_checkpointing", true}, {"gradient_checkpointing_interval", 2}});
  ASSERT_TRUE(off["profile_available"].get<bool>()) << off.dump();
  EXPECT_NE(off["basis"].get<std::string>().find("profile"), std::string::npos);
  EXPECT_DOUBLE_EQ(off["step_time_factor"].get<double>(), 1.0);
  EXPECT_EQ(off["predicted_peak_bytes"], off["no_checkpointing_peak_bytes"]);
  EXPECT_LT(every["predicted_peak_bytes"].get<int64_t>(), off["predicted_peak_bytes"].get<int64_t>());
  EXPECT_GT(every["step_time_factor"].get<double>(), 1.0);
  EXPECT_NE(two["predicted_peak_bytes"], every["predicted_peak_bytes"]);
  EXPECT_NE(two["layout"], every["layout"]);

  // auto under a budget between the smallest possible peak and no checkpointing: fits, within it.
  const int64_t low = every["auto"]["min_possible_peak_bytes"].get<int64_t>();
  const int64_t high = off["predicted_peak_bytes"].get<int64_t>();
  const int64_t budget = low + (high - low) / 2;
  const json picked = plan({{"gradient_checkpointing_interval", "auto"}}, budget);
  EXPECT_EQ(picked["auto"]["budget_bytes"].get<int64_t>(), budget);
  EXPECT_TRUE(picked["auto"]["fits"].get<bool>()) << picked.dump();
  EXPECT_LE(picked["auto"]["predicted_peak_bytes"].get<int64_t>(), budget);

  // A model too large to profile here: the memory model's bytes, and the answer says so.
  const json big = plan({{"model_flavour", "dev"}});
  EXPECT_FALSE(big["profile_available"].get<bool>());
  EXPECT_NE(big["basis"].get<std::string>().find("no step profile"), std::string::npos);
  const json& m = big["model_bytes"];
  EXPECT_EQ(big["predicted_peak_bytes"].get<int64_t>(),
            m["weights"].get<int64_t>() + m["gradients"].get<int64_t>() + m["optimizer"].get<int64_t>());

  // The base as training stores it (base_model_precision), as `remat plan` counts it.
  const json lora = plan({{"model_flavour", "dev"}, {"model_type", "lora"}, {"lora_rank", 16}});
  const json lora_int8 =
      plan({{"model_flavour", "dev"}, {"model_type", "lora"}, {"lora_rank", 16}, {"base_model_precision", "int8-quanto"}});
  EXPECT_LT(lora_int8["model_bytes"]["weights"].get<int64_t>(), lora["model_bytes"]["weights"].get<int64_t>() / 2)
      << lora_int8["model_bytes"].dump() << " vs " << lora["model_bytes"].dump();

  auto invalid = c.Post("/api/plan", kUiHeader, json{{"config", {{"gradient_checkpointing_interval", 0}}}}.dump(),
                        "application/json");
  EXPECT_EQ(invalid->status, 400);
}

TEST_F(UiApiTest, ConfigsAreSavedAtomicallyListedAndLoaded) {
  UiServer ui(options());
  auto c = ui.client();
  const json config = {{"model_family", "flux"}, {"model_flavour", "flux-tiny"}, {"lora_rank", 4}};
  const json datasets = json::array({{{"id", "pics"}, {"type", "local"}, {"instance_data_dir", "pics"}}});
  auto put = c.Put("/api/configs/my-run_1.0", kUiHeader,
                   json{{"config", config}, {"multidatabackend", datasets}}.dump(), "application/json");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 200) << put->body;
  const std::string dir = dir_ / "configs/my-run_1.0";
  json on_disk = json::parse(read_file(dir + "/config.json"));
  json expected = config;
  expected["data_backend_config"] = "configs/my-run_1.0/multidatabackend.json";
  EXPECT_EQ(on_disk, expected);
  EXPECT_EQ(json::parse(read_file(dir + "/multidatabackend.json")), datasets);
  for (const auto& entry : fs::directory_iterator(dir)) {  // no temporary file left behind
    EXPECT_TRUE(entry.path().filename() == "config.json" || entry.path().filename() == "multidatabackend.json")
        << entry.path();
  }
  json list = body_json(c.Get("/api/configs"));
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["name"], "my-run_1.0");
  EXPECT_EQ(list[0]["path"], fs::canonical(dir + "/config.json").string());
  json loaded = body_json(c.Get("/api/configs/my-run_1.0"));
  EXPECT_EQ(loaded["config"], expected);
  EXPECT_EQ(loaded["multidatabackend"], datasets);
  EXPECT_EQ(c.Get("/api/configs/nothing")->status, 404);

  for (const std::string bad : {"..", ".hidden", "a..b", "sp%20ace", "%2e%2e", "x%2Fy"}) {
    auto r = c.Put("/api/configs/" + bad, kUiHeader, json{{"config", config}}.dump(), "application/json");
    ASSERT_TRUE(r) << bad;
    EXPECT_GE(r->status, 400) << bad;
  }
  EXPECT_FALSE(fs::exists(dir_.path().parent_path() / "config.json"));
  auto not_object = c.Put("/api/configs/x", kUiHeader, json{{"config", json::array()}}.dump(), "application/json");
  EXPECT_EQ(not_object->status, 400);
}

}  // namespace ui_api_test
}  // namespace
