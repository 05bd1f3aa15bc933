#pragma once
// A request's {"config": {...}} as option values, read as `remat train` reads a config.json.

#include <nlohmann/json.hpp>

#include "remat/train/options/config_text.h"

namespace remat::ui::detail {

/// body["config"] through train::read_config_json_text. Throws c10::ValueError when "config" is
/// missing or not an object, train::ValidationError when the CLI would refuse the file.
train::OptionValues config_values(const nlohmann::json& body);

/// {"errors": [{"option", "message"}], "warnings": [...]} of a validation.
nlohmann::json validation_json(const train::ValidationReport& report);

}  // namespace remat::ui::detail
