#pragma once
// Private helpers for reading diffusers config.json files (nlohmann_json is a private dependency,
// used only in .cpp files of the library).

#include <cctype>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/error.h"

namespace remat::models::detail {

inline nlohmann::json parse_config_json(const std::string& text, const char* component) {
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object()) {
      throw_value_error(std::string("[") + component + "] config JSON must be an object");
    }
    return j;
  } catch (const nlohmann::json::parse_error& e) {
    throw_value_error(std::string("[") + component + "] malformed config JSON: " + e.what());
  }
}

inline std::string read_text_file(const std::string& path, const char* component) {
  std::ifstream in(path);
  if (!in) throw_value_error(std::string("[") + component + "] cannot open config file '" + path + "'");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

/// Whether `s` looks like JSON text (first non-blank character '{') rather than a path.
inline bool looks_like_json(const std::string& s) {
  for (char ch : s) {
    if (!std::isspace(static_cast<unsigned char>(ch))) return ch == '{';
  }
  return false;
}

/// Reads an integer field if present (and not null); wrong types raise a message naming the key.
inline void read_int(const nlohmann::json& j, const char* key, int64_t& out, const char* component) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_number_integer()) {
    throw_value_error(std::string("[") + component + "] config key '" + key +
                                "' must be an integer, got " + it->dump());
  }
  out = it->get<int64_t>();
}

inline void read_bool(const nlohmann::json& j, const char* key, bool& out, const char* component) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_boolean()) {
    throw_value_error(std::string("[") + component + "] config key '" + key +
                                "' must be a boolean, got " + it->dump());
  }
  out = it->get<bool>();
}

inline void read_int_list(const nlohmann::json& j, const char* key, std::vector<int64_t>& out,
                          const char* component) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  bool ok = it->is_array();
  if (ok) {
    for (const auto& v : *it) ok = ok && v.is_number_integer();
  }
  if (!ok) {
    throw_value_error(std::string("[") + component + "] config key '" + key +
                                "' must be a list of integers, got " + it->dump());
  }
  out = it->get<std::vector<int64_t>>();
}

}  // namespace remat::models::detail
