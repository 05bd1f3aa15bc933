#pragma once
// A step model (remat/train/memory/auto_layout.h) as JSON: how a profile measured in a child process
// comes back to the server. Every field travels; doubles are written with enough digits to be
// read back exactly, so the figures are those of a profile made in the server itself.

#include <nlohmann/json.hpp>

#include "remat/train/memory/auto_layout.h"

namespace remat::ui::detail {

nlohmann::json step_model_json(const train::StepModel& model);
/// Throws nlohmann::json::exception when a field is missing or of the wrong type.
train::StepModel step_model_from_json(const nlohmann::json& json);

}  // namespace remat::ui::detail
