#pragma once
// The JSON API's routes (docs/UI.md, "API"), one file per group; what they share.

#include <stdexcept>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace remat::ui::detail {

/// What a request names does not exist: the server answers 404 with the message.
struct NotFound : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class RunManager;
class PlanCache;

/// What every route may use. Owned by the server; outlives the routes.
struct ApiContext {
  std::string workspace;  ///< canonical, no trailing '/'
  RunManager* runs = nullptr;
  PlanCache* plans = nullptr;
};

/// Writes `body` as the JSON response.
void send_json(httplib::Response& res, const nlohmann::json& body, int status = 200);
/// Writes {"error": message} with `status`.
void send_error(httplib::Response& res, int status, const std::string& message);
/// The request body as a JSON object (bounded: remat/util/bounded_json.h). Throws c10::ValueError
/// naming what is wrong (the server answers 400 with it).
nlohmann::json parse_json_body(const httplib::Request& req);

void add_options_routes(httplib::Server& server, ApiContext& context);
void add_validate_routes(httplib::Server& server, ApiContext& context);
void add_plan_routes(httplib::Server& server, ApiContext& context);
void add_config_routes(httplib::Server& server, ApiContext& context);
void add_run_routes(httplib::Server& server, ApiContext& context);

}  // namespace remat::ui::detail
