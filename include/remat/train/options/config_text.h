#pragma once
/// \file
/// A config.json given as text rather than a file (what `remat ui` receives in a request).

#include <string>

#include "remat/export.h"
#include "remat/train/options/config.h"

namespace remat::train {

/// The text of a config.json, read exactly as read_config_file reads a .json file (`where` names
/// it in messages): what `remat ui` validates and runs goes through the same reading as a file.
/// Throws ValidationError as read_config_file does.
REMAT_API OptionValues read_config_json_text(const std::string& text, const std::string& where);

}  // namespace remat::train
