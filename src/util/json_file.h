#pragma once
// Private helpers, shared by every layer, for JSON documents a user hands remat (dataset configs,
// model_index.json, shard indexes, training configs): read as a bounded regular file, checked
// before parsing (remat/util/bounded_json.h), and every syntax error quoted with the document's name.

#include <string>

#include <nlohmann/json.hpp>

#include "remat/util/bounded_json.h"
#include "remat/util/error.h"
#include "remat/util/files.h"

namespace remat::detail {

/// `text` parsed as JSON once its size and depth are within util::kMaxJsonFileBytes and
/// util::kMaxJsonDepth. Throws c10::ValueError "[component] <document> ...": `document` names
/// it ("config '/x/c.json'", "shard index '/x/i.json'"), as do the bound checks.
inline nlohmann::json parse_json_text(const std::string& text, const std::string& component,
                                      const std::string& document) {
  util::check_json_text(text, util::kMaxJsonFileBytes, "[" + component + "] " + document);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw_value_error("[" + component + "] " + document + " is not valid JSON: " + util::json_error_excerpt(e));
  }
}

/// The JSON document in the file `path` (a regular file: util::read_regular_file), parsed by
/// parse_json_text; `kind` names the document in every message ("model_index.json").
inline nlohmann::json read_json_file(const std::string& path, const std::string& component, const std::string& kind) {
  const std::string text = util::read_regular_file(path, util::kMaxJsonFileBytes, component, kind);
  return parse_json_text(text, component, kind + " '" + path + "'");
}

}  // namespace remat::detail
