#pragma once
// Config-file formats with their own parser: TOML (toml++, compiled in config_formats.cpp only).

#include <functional>
#include <optional>
#include <string>

#include "remat/train/options/config.h"

namespace remat::train {

/// Adds one key of a config file to `values`: (values, key as written, value as text or null,
/// whether the value is nested (JSON text of a table or array)).
using AddConfigValue =
    std::function<void(OptionValues& values, const std::string& key, std::optional<std::string> value, bool nested)>;

/// Reads the top-level keys of the TOML file `path` through `add`: strings as they are,
/// numbers and booleans as their text, tables and arrays as JSON text (nested). Throws
/// ValidationError for an unreadable file or a TOML syntax error (with line and column).
OptionValues read_toml_config(const std::string& path, const AddConfigValue& add);

}  // namespace remat::train
