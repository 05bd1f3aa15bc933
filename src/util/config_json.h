#pragma once
// Private helpers, shared by every layer, for reading diffusers / transformers config.json files
// (nlohmann_json is a private dependency, used only in .cpp files of the library).

#include <cctype>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
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

// Note [Config fields]
// Each config lists its config.json fields once, as a generic function of (config, field):
//
//   constexpr auto t5_fields = [](auto& c, auto&& field) {
//     field("vocab_size", c.vocab_size);
//     ...
//   };
//
// Called with a mutable config and a ConfigFieldReader it reads the file, with a const config and
// a ConfigFieldWriter it writes one, and same_fields compares two configs through the writer.
// Special cases (defaults that depend on other keys, values that may be null or of two types,
// keys that must be absent) stay by hand next to the list.

/// Reads fields of a parsed config.json object: an absent or null key leaves the field as it is
/// (the config's default); a value of the wrong type raises `where` + "config key 'KEY' must be
/// ..., got VALUE". `where` is the message prefix of the config ("[t5] ", "[vae] origin: ").
class ConfigFieldReader {
 public:
  ConfigFieldReader(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}

  /// Whether the file sets `key` (present and not null).
  bool has(const char* key) const { return find(key) != nullptr; }

  void operator()(const char* key, int64_t& out) const {
    if (const nlohmann::json* v = find(key)) {
      if (!is_int64(*v)) fail(key, "an integer (64-bit)", *v);
      out = v->get<int64_t>();
    }
  }
  void operator()(const char* key, double& out) const {
    if (const nlohmann::json* v = find(key)) {
      if (!v->is_number()) fail(key, "a number", *v);
      out = v->get<double>();
    }
  }
  void operator()(const char* key, bool& out) const {
    if (const nlohmann::json* v = find(key)) {
      if (!v->is_boolean()) fail(key, "a boolean", *v);
      out = v->get<bool>();
    }
  }
  void operator()(const char* key, std::string& out) const {
    if (const nlohmann::json* v = find(key)) {
      if (!v->is_string()) fail(key, "a string", *v);
      out = v->get<std::string>();
    }
  }
  void operator()(const char* key, std::vector<int64_t>& out) const {
    if (const nlohmann::json* v = find(key)) {
      bool ok = v->is_array();
      if (ok) {
        for (const auto& e : *v) ok = ok && is_int64(e);
      }
      if (!ok) fail(key, "a list of integers", *v);
      out = v->get<std::vector<int64_t>>();
    }
  }

 private:
  const nlohmann::json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void fail(const char* key, const char* what, const nlohmann::json& value) const {
    throw_value_error(where_ + "config key '" + key + "' must be " + what + ", got " + util::json_excerpt(value));
  }

  const nlohmann::json& j_;
  std::string where_;
};

/// Writes fields into a config.json object (`j[key] = value`).
struct ConfigFieldWriter {
  nlohmann::json& j;
  template <typename T>
  void operator()(const char* key, const T& value) const {
    j[key] = value;
  }
};

/// Whether `a` and `b` agree on every field that `fields` lists (compared as written to JSON:
/// integers, strings and booleans exactly, numbers as doubles).
template <typename Config, typename Fields>
bool same_fields(const Config& a, const Config& b, Fields&& fields) {
  nlohmann::json ja = nlohmann::json::object();
  nlohmann::json jb = nlohmann::json::object();
  fields(a, ConfigFieldWriter{ja});
  fields(b, ConfigFieldWriter{jb});
  return ja == jb;
}

}  // namespace remat::detail
