// POST /api/validate: every error and warning of a config, per option, from the validation
// `remat train` runs (read_config_json_text + validate_option_values: registry types, ranges,
// choices, relations, dependencies and the checkpointing safety check), not a copy of it.
#include "api.h"
#include "config_values.h"
#include "remat/train/options/config.h"

namespace remat::ui::detail {

nlohmann::json validation_json(const train::ValidationReport& report) {
  nlohmann::json errors = nlohmann::json::array();
  nlohmann::json warnings = nlohmann::json::array();
  for (const auto& d : report.diagnostics) {
    nlohmann::json item = {{"option", d.option}, {"message", d.message}};
    (d.severity == train::Diagnostic::Severity::Error ? errors : warnings).push_back(item);
  }
  return {{"errors", errors}, {"warnings", warnings}};
}

void add_validate_routes(httplib::Server& server, ApiContext&) {
  server.Post("/api/validate", [](const httplib::Request& req, httplib::Response& res) {
    const nlohmann::json body = parse_json_body(req);
    train::OptionValues values;
    try {
      values = config_values(body);
    } catch (const train::ValidationError& e) {
      // The config as a whole cannot be read (a key twice, a nested value): one error, its option.
      send_json(res, {{"errors", {{{"option", e.option()}, {"message", e.message()}}}},
                      {"warnings", nlohmann::json::array()}});
      return;
    }
    send_json(res, validation_json(train::validate_option_values(values)));
  });
}

}  // namespace remat::ui::detail
