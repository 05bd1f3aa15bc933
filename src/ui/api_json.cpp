#include <c10/util/Exception.h>

#include "api.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"

namespace remat::ui::detail {

void send_json(httplib::Response& res, const nlohmann::json& body, int status) {
  res.status = status;
  // Invalid UTF-8 in a file name or a log line must not make dump() throw mid-response.
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  send_json(res, nlohmann::json{{"error", message}}, status);
}

nlohmann::json parse_json_body(const httplib::Request& req) {
  util::check_json_text(req.body, util::kMaxJsonFileBytes, "[ui] request body");
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(req.body);
  } catch (const nlohmann::json::exception& e) {
    throw_value_error("[ui] the request body must be JSON, got: " + util::json_error_excerpt(e));
  }
  if (!body.is_object()) {
    throw_value_error("[ui] the request body must be a JSON object, got a " + std::string(body.type_name()));
  }
  return body;
}

}  // namespace remat::ui::detail
