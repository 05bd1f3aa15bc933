#pragma once
// Private helpers, shared by every layer, for reading diffusers / transformers config.json files
// (nlohmann_json is a private dependency, used only in .cpp files of the library).

#include <cctype>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"

namespace remat::detail {

// Note [Bounded JSON] (remat/util/bounded_json.h): size and depth are checked before parsing, and
// messages quote bounded excerpts.
inline nlohmann::json parse_config_json(const std::string& text, const char* component) {
  util::check_json_text(text, util::kMaxJsonFileBytes, std::string("[") + component + "] config JSON");
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object()) {
      throw_value_error(std::string("[") + component + "] config JSON must be an object");
    }
    return j;
  } catch (const nlohmann::json::parse_error& e) {
    throw_value_error(std::string("[") + component + "] malformed config JSON: " +
                      util::json_error_excerpt(e));
  }
}

/// The text of a config file: a regular file (a FIFO would block) of at most kMaxJsonFileBytes.
inline std::string read_text_file(const std::string& path, const char* component) {
  return util::read_regular_file(path, util::kMaxJsonFileBytes, component, "config file");
}

/// parse(text of the config file `path`), with `path` in every error parse raises: a message
/// "[tag] what" becomes "[tag] 'path': what" (messages that already name the path are left
/// alone). Every config.json reader goes through here, so no message leaves the reader
/// of a file without its name.
template <typename Parse>
auto parse_config_file(const std::string& path, const char* component, Parse&& parse) {
  const std::string text = read_text_file(path, component);
  try {
    return parse(text);
  } catch (const c10::ValueError& e) {
    const std::string message = e.what_without_backtrace();
    if (message.find(path) != std::string::npos) throw;
    // The path goes right after the message's own tag ("[flux] "), or after one of ours.
    const size_t close = message.rfind("] ", message.find(' '));
    if (!message.empty() && message.front() == '[' && close != std::string::npos) {
      throw_value_error(message.substr(0, close + 2) + "'" + path + "': " + message.substr(close + 2));
    }
    throw_value_error(std::string("[") + component + "] '" + path + "': " + message);
  }
}

/// Whether `s` looks like JSON text (first non-blank character '{') rather than a path.
inline bool looks_like_json(const std::string& s) {
  for (char ch : s) {
    if (!std::isspace(static_cast<unsigned char>(ch))) return ch == '{';
  }
  return false;
}

/// Whether `v` is an integer that int64 holds (nlohmann keeps integers above 2^63 - 1 as
/// unsigned; get<int64_t> would wrap them to negative numbers).
inline bool is_int64(const nlohmann::json& v) {
  return v.is_number_integer() &&
         (!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX));
}

/// Reads an integer field if present (and not null); wrong types raise a message naming the key.
inline void read_int(const nlohmann::json& j, const char* key, int64_t& out, const char* component) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!is_int64(*it)) {
    throw_value_error(std::string("[") + component + "] config key '" + key +
                                "' must be an integer (64-bit), got " + util::json_excerpt(*it));
  }
  out = it->get<int64_t>();
}

inline void read_bool(const nlohmann::json& j, const char* key, bool& out, const char* component) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_boolean()) {
    throw_value_error(std::string("[") + component + "] config key '" + key +
                                "' must be a boolean, got " + util::json_excerpt(*it));
  }
  out = it->get<bool>();
}

inline void read_int_list(const nlohmann::json& j, const char* key, std::vector<int64_t>& out,
                          const char* component) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  bool ok = it->is_array();
  if (ok) {
    for (const auto& v : *it) ok = ok && is_int64(v);
  }
  if (!ok) {
    throw_value_error(std::string("[") + component + "] config key '" + key +
                                "' must be a list of integers, got " + util::json_excerpt(*it));
  }
  out = it->get<std::vector<int64_t>>();
}

}  // namespace remat::detail
