#include "config_values.h"

#include "remat/util/error.h"

namespace remat::ui::detail {

train::OptionValues config_values(const nlohmann::json& body) {
  if (!body.contains("config") || !body["config"].is_object()) {
    throw_value_error("[ui] the request needs {\"config\": {...}}: an object of option values");
  }
  return train::read_config_json_text(body["config"].dump(), "the request's config");
}

}  // namespace remat::ui::detail
