// GET /api/options: the options registry exactly as `remat options --json` prints it, plus
// "languages": the checkpointing options' help in the docs' six languages.
#include "api.h"
#include "help_translations.h"
#include "remat/train/options/options.h"

namespace remat::ui::detail {

void add_options_routes(httplib::Server& server, ApiContext&) {
  // The registry is fixed for the life of the process: build the answer once.
  static const std::string body = [] {
    nlohmann::json schema = nlohmann::json::parse(train::options_json());
    schema["languages"] = help_translations();
    return schema.dump();
  }();
  server.Get("/api/options", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(body, "application/json");
  });
}

}  // namespace remat::ui::detail
