// SimpleTuner's config.toml (helpers/configuration/toml_file.py: a flat table of option names),
// read with toml++ (Debian's libtomlplusplus-dev) in its header-only form, so the installed
// library does not depend on the toml++ shared library.
#define TOML_HEADER_ONLY 1
#define TOML_ENABLE_FORMATTERS 1
#include <toml++/toml.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "options/config_formats.h"

namespace remat::train {
namespace {

// The shortest text that reads back as the same double.
std::string round_trip_text(double v) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace

OptionValues read_toml_config(const std::string& path, const AddConfigValue& add) {
  if (!std::ifstream(path)) {
    throw ValidationError("config", path, "[train] config must be a readable TOML file, got '" + path + "'");
  }
  toml::table doc;
  try {
    doc = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw ValidationError("config", path,
                          "[train] config must be valid TOML, got '" + path + "': " + std::string(e.description()) +
                              " (line " + std::to_string(where.line) + ", column " +
                              std::to_string(where.column) + ")");
  }
  OptionValues values;
  for (const auto& [key, node] : doc) {
    const std::string name(key.str());
    if (const auto* s = node.as_string()) {
      add(values, name, s->get(), false);
    } else if (const auto* i = node.as_integer()) {
      add(values, name, std::to_string(i->get()), false);
    } else if (const auto* f = node.as_floating_point()) {
      add(values, name, round_trip_text(f->get()), false);
    } else if (const auto* b = node.as_boolean()) {
      add(values, name, std::string(b->get() ? "true" : "false"), false);
    } else {
      // Tables, arrays, dates: their JSON text (only options remat ignores take one).
      std::ostringstream json;
      node.visit([&json](auto&& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (toml::is_table<V> || toml::is_array<V>) json << toml::json_formatter{v};
        else json << '"' << v << '"';
      });
      add(values, name, nlohmann::json::parse(json.str()).dump(), true);  // compact, as from JSON
    }
  }
  return values;
}

}  // namespace remat::train
