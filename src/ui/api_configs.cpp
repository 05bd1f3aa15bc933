// The workspace's configs: GET /api/configs, GET and PUT /api/configs/<name>. A config is saved as
// SimpleTuner lays it out, <workspace>/configs/<name>/config.json, with its datasets beside it
// in multidatabackend.json; each file written atomically (temp file + rename).
#include <filesystem>

#include "json_file.h"
#include "api.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"
#include "workspace.h"

namespace remat::ui::detail {
namespace {
namespace fs = std::filesystem;

nlohmann::json read_json_file(const std::string& path) { return remat::detail::read_json_file(path, "ui", "config"); }

// The folder of config `name`, which must be a real folder inside the workspace (a symlink
// configs/<name> pointing elsewhere is refused).
std::string existing_config_dir(const ApiContext& context, const std::string& name) {
  check_config_name(name);
  const std::string dir = confined_existing_path(context.workspace, "configs/" + name);
  if (!fs::is_regular_file(dir + "/config.json")) throw NotFound("[ui] no config named '" + name + "'");
  return dir;
}

}  // namespace

void add_config_routes(httplib::Server& server, ApiContext& context) {
  server.Get("/api/configs", [&context](const httplib::Request&, httplib::Response& res) {
    nlohmann::json list = nlohmann::json::array();
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(fs::path(context.workspace) / "configs")) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      try {
        const std::string dir = existing_config_dir(context, name);
        list.push_back({{"name", name}, {"path", dir + "/config.json"}});
      } catch (const std::exception&) {
        // Not a config of ours (a stray file, a symlink out, a bad name): not listed.
      }
    }
    send_json(res, list);
  });

  server.Get(R"(/api/configs/([^/]+))", [&context](const httplib::Request& req, httplib::Response& res) {
    const std::string dir = existing_config_dir(context, req.matches[1]);
    nlohmann::json body = {{"name", std::string(req.matches[1])}, {"config", read_json_file(dir + "/config.json")}};
    if (fs::exists(dir + "/multidatabackend.json")) {
      const std::string datasets = confined_existing_path(context.workspace,
                                                          "configs/" + std::string(req.matches[1]) +
                                                              "/multidatabackend.json");
      body["multidatabackend"] = read_json_file(datasets);
    }
    send_json(res, body);
  });

  server.Put(R"(/api/configs/([^/]+))", [&context](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    const std::string dir = config_dir(context.workspace, name);
    const nlohmann::json body = parse_json_body(req);
    if (!body.contains("config") || !body["config"].is_object()) {
      throw_value_error("[ui] PUT /api/configs/<name> needs {\"config\": {...}}: an object of option values");
    }
    nlohmann::json config = body["config"];
    const bool has_datasets = body.contains("multidatabackend") && !body["multidatabackend"].is_null();
    if (has_datasets && !body["multidatabackend"].is_array()) {
      throw_value_error("[ui] multidatabackend must be an array of dataset objects, as in SimpleTuner's "
                        "multidatabackend.json");
    }
    // A symlink configs/<name> (or configs itself) leading out is refused before anything is written.
    std::error_code ec;
    fs::create_directory(dir, ec);
    const std::string real_dir = confined_existing_path(context.workspace, "configs/" + name);
    if (has_datasets) {
      util::write_file_atomically(real_dir + "/multidatabackend.json", body["multidatabackend"].dump(2) + "\n", "ui");
      // Relative to the workspace, where runs start (SimpleTuner: config/<name>/multidatabackend.json).
      if (!config.contains("data_backend_config") && !config.contains("--data_backend_config")) {
        config["data_backend_config"] = "configs/" + name + "/multidatabackend.json";
      }
    }
    util::write_file_atomically(real_dir + "/config.json", config.dump(2) + "\n", "ui");
    send_json(res, {{"name", name}, {"path", real_dir + "/config.json"}});
  });
}

}  // namespace remat::ui::detail
