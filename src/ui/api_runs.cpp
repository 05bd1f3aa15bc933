// Runs: POST /api/runs (start), GET /api/runs, GET /api/runs/<id>, its metrics and log lines
// from a line number on (the page polls), POST /api/runs/<id>/stop (SIGINT), and the files of
// its output_dir (validation pictures), confined to the workspace.
#include <algorithm>
#include <filesystem>
#include <sstream>

#include "api.h"
#include "config_values.h"
#include "embedded_files.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"
#include "remat/train/options/config.h"
#include "runs.h"
#include "workspace.h"

namespace remat::ui::detail {
namespace {
namespace fs = std::filesystem;

// The most lines one log request returns, and the largest file the API reads or sends.
constexpr size_t kMaxLinesPerRequest = 2000;
constexpr uint64_t kMaxServedFileBytes = uint64_t{256} << 20;

int64_t from_param(const httplib::Request& req) {
  if (!req.has_param("from")) return 0;
  const std::string text = req.get_param_value("from");
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < 0) {
    throw_value_error("[ui] from must be a line number >= 0, got '" + util::text_excerpt(text) + "'");
  }
  return value;
}

// The complete lines of `path` from line `from` on (at most kMaxLinesPerRequest), and the number
// of the line after the last one returned. A last line without its newline is still being
// written: it comes with a later request.
std::pair<std::vector<std::string>, int64_t> read_lines(const std::string& path, int64_t from) {
  std::vector<std::string> lines;
  std::string text;
  try {
    text = util::read_regular_file(path, kMaxServedFileBytes, "ui", "file");
  } catch (const c10::ValueError&) {
    return {lines, from};  // not written yet
  }
  int64_t number = 0;
  size_t begin = 0;
  while (begin < text.size() && lines.size() < kMaxLinesPerRequest) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) break;
    if (number >= from) lines.push_back(text.substr(begin, end - begin));
    ++number;
    begin = end + 1;
  }
  return {lines, std::max(from, number)};
}

}  // namespace

void add_run_routes(httplib::Server& server, ApiContext& context) {
  RunManager& runs = *context.runs;

  server.Post("/api/runs", [&runs](const httplib::Request& req, httplib::Response& res) {
    const nlohmann::json body = parse_json_body(req);
    if (!body.contains("config_name") || !body["config_name"].is_string()) {
      throw_value_error("[ui] POST /api/runs needs {\"config_name\": \"<name>\"}, a config saved in the workspace");
    }
    try {
      const std::string id = runs.start(body["config_name"].get<std::string>());
      send_json(res, run_status_json(runs.get(id)), 201);
    } catch (const train::ValidationErrors& e) {
      nlohmann::json errors = nlohmann::json::array();
      for (const auto& d : e.errors()) errors.push_back({{"option", d.option}, {"message", d.message}});
      send_json(res, {{"error", "[ui] the config has errors; the run was not started"}, {"errors", errors}}, 400);
    }
  });

  server.Get("/api/runs", [&runs](const httplib::Request&, httplib::Response& res) {
    nlohmann::json list = nlohmann::json::array();
    for (const Run& run : runs.list()) list.push_back(run_status_json(run));
    send_json(res, list);
  });

  server.Get(R"(/api/runs/([^/]+))", [&runs](const httplib::Request& req, httplib::Response& res) {
    send_json(res, run_status_json(runs.get(req.matches[1])));
  });

  server.Get(R"(/api/runs/([^/]+)/metrics)", [&runs](const httplib::Request& req, httplib::Response& res) {
    const Run run = runs.get(req.matches[1]);
    const auto lines = read_lines(run.output_dir + "/metrics.jsonl", from_param(req));
    nlohmann::json records = nlohmann::json::array();
    for (const auto& line : lines.first) {
      nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
      if (!record.is_discarded()) records.push_back(std::move(record));
    }
    send_json(res, {{"records", records}, {"next", lines.second}});
  });

  server.Get(R"(/api/runs/([^/]+)/log)", [&runs](const httplib::Request& req, httplib::Response& res) {
    const Run run = runs.get(req.matches[1]);
    const auto lines = read_lines(run.log_path, from_param(req));
    send_json(res, {{"lines", lines.first}, {"next", lines.second}});
  });

  server.Post(R"(/api/runs/([^/]+)/stop)", [&runs](const httplib::Request& req, httplib::Response& res) {
    const bool was_running = runs.stop(req.matches[1]);
    nlohmann::json status = run_status_json(runs.get(req.matches[1]));
    status["stop_sent"] = was_running;
    send_json(res, status);
  });

  // The run's output_dir must itself be inside the workspace for its files to be served.
  server.Get(R"(/api/runs/([^/]+)/files/(.+))", [&runs, &context](const httplib::Request& req,
                                                                  httplib::Response& res) {
    const Run run = runs.get(req.matches[1]);
    std::error_code ec;
    const std::string root = fs::canonical(run.output_dir, ec).string();
    if (ec) throw NotFound("[ui] the run has no output folder yet");
    if (!is_within(context.workspace, root)) {
      send_error(res, 403, "[ui] the run's output_dir '" + run.output_dir + "' is outside the workspace; its files "
                           "are not served");
      return;
    }
    const std::string path = confined_existing_path(root, req.matches[2]);
    res.set_content(util::read_regular_file(path, kMaxServedFileBytes, "ui", "file"), content_type_of(path).c_str());
  });
}

}  // namespace remat::ui::detail
