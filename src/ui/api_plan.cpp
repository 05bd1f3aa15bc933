// POST /api/plan: the planner's figures for a config (plan_figures.h): the predicted peak and
// step-time factor of its checkpoint layout, what `auto` picks under the budget, and the basis;
// or why there are none (a step profile beyond the server's memory or time limit: 422).
#include "api.h"
#include "config_values.h"
#include "plan_figures.h"
#include "remat/util/error.h"
#include "remat/train/options/config.h"

namespace remat::ui::detail {

void add_plan_routes(httplib::Server& server, ApiContext& context) {
  server.Post("/api/plan", [&context](const httplib::Request& req, httplib::Response& res) {
    const nlohmann::json body = parse_json_body(req);
    std::optional<int64_t> budget;
    if (body.contains("budget_bytes") && !body["budget_bytes"].is_null()) {
      if (!body["budget_bytes"].is_number_integer() || body["budget_bytes"].get<int64_t>() <= 0) {
        throw_value_error("[ui] budget_bytes must be a whole number of bytes > 0, got " + body["budget_bytes"].dump());
      }
      budget = body["budget_bytes"].get<int64_t>();
    }
    const train::ValidationReport report = train::validate_option_values(config_values(body));
    if (!report.ok()) {
      nlohmann::json answer = validation_json(report);
      answer["error"] = "[ui] the config has errors; no figures for it";
      send_json(res, answer, 400);
      return;
    }
    try {
      send_json(res, context.plans->figures(body["config"], report.config, budget));
    } catch (const PlanRefusal& refusal) {
      send_json(res, refusal.body, refusal.status);
    }
  });
}

}  // namespace remat::ui::detail
