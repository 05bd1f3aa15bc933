#pragma once
// Building rows of the options registry: an OptionSpec bound to a TrainConfig field, written
// fluently. The registry (options.cpp) and the families' own options (families/*.cpp) use it.

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "remat/byte_size.h"
#include "remat/train/options/config.h"
#include "remat/train/options/options.h"

namespace remat::train {

// Shortest text that reads back to the same double, with a ".0" on whole numbers so that a float
// option's default never looks like an integer ("3.0", "4e-07").
inline std::string render_float(double v) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

struct Binding {
  std::function<void(TrainConfig&, const OptionValue&)> assign;
  std::function<std::optional<std::string>(const TrainConfig&)> render;
};

inline Binding bind_field(bool TrainConfig::*m) {
  return {[m](TrainConfig& c, const OptionValue& v) { c.*m = std::get<bool>(v); },
          [m](const TrainConfig& c) -> std::optional<std::string> { return c.*m ? "true" : "false"; }};
}
inline Binding bind_field(int64_t TrainConfig::*m) {
  return {[m](TrainConfig& c, const OptionValue& v) { c.*m = std::get<int64_t>(v); },
          [m](const TrainConfig& c) -> std::optional<std::string> { return std::to_string(c.*m); }};
}
inline Binding bind_field(double TrainConfig::*m) {
  return {[m](TrainConfig& c, const OptionValue& v) { c.*m = std::get<double>(v); },
          [m](const TrainConfig& c) -> std::optional<std::string> { return render_float(c.*m); }};
}
// A string field; unset (nullable options only) is stored as "".
inline Binding bind_field(std::string TrainConfig::*m) {
  return {[m](TrainConfig& c, const OptionValue& v) {
            c.*m = std::holds_alternative<std::string>(v) ? std::get<std::string>(v) : std::string();
          },
          [m](const TrainConfig& c) -> std::optional<std::string> {
            if ((c.*m).empty()) return std::nullopt;
            return c.*m;
          }};
}
inline Binding bind_field(std::optional<std::string> TrainConfig::*m) {
  return {[m](TrainConfig& c, const OptionValue& v) {
            if (std::holds_alternative<std::string>(v)) c.*m = std::get<std::string>(v);
            else c.*m = std::nullopt;
          },
          [m](const TrainConfig& c) { return c.*m; }};
}
inline Binding bind_field(std::optional<double> TrainConfig::*m) {
  return {[m](TrainConfig& c, const OptionValue& v) {
            if (std::holds_alternative<double>(v)) c.*m = std::get<double>(v);
            else c.*m = std::nullopt;
          },
          [m](const TrainConfig& c) -> std::optional<std::string> {
            if (!(c.*m)) return std::nullopt;
            return render_float(*(c.*m));
          }};
}
inline Binding bind_field(std::optional<int64_t> TrainConfig::*m, bool bytes = false) {
  return {[m](TrainConfig& c, const OptionValue& v) {
            if (std::holds_alternative<int64_t>(v)) c.*m = std::get<int64_t>(v);
            else c.*m = std::nullopt;
          },
          [m, bytes](const TrainConfig& c) -> std::optional<std::string> {
            if (!(c.*m)) return std::nullopt;
            return bytes ? format_byte_size(*(c.*m)) : std::to_string(*(c.*m));
          }};
}
// gradient_checkpointing_interval: a whole number of blocks, or the keyword "auto" (the budget
// planner picks the layout), as one CheckpointInterval (its parse and text are the registry's:
// options.cpp).
inline Binding bind_interval() {
  return {[](TrainConfig& c, const OptionValue& v) {
            if (std::holds_alternative<std::string>(v)) c.gradient_checkpointing_interval = CheckpointInterval::automatic();
            else if (std::holds_alternative<int64_t>(v)) c.gradient_checkpointing_interval = CheckpointInterval::blocks(std::get<int64_t>(v));
            else c.gradient_checkpointing_interval = CheckpointInterval{};
          },
          [](const TrainConfig& c) { return c.gradient_checkpointing_interval.text(); }};
}

// Fluent construction of one table row.
class Opt {
 public:
  Opt(std::string section, std::string name, OptionType type, Binding binding, std::string help) {
    spec_.section = std::move(section);
    spec_.name = std::move(name);
    spec_.type = type;
    spec_.assign = std::move(binding.assign);
    spec_.render = std::move(binding.render);
    spec_.help = std::move(help);
  }
  Opt& tooltip(std::string t) { spec_.tooltip = std::move(t); return *this; }
  Opt& min(double v, bool exclusive = false) { spec_.minimum = v; spec_.exclusive_minimum = exclusive; return *this; }
  Opt& max(double v) { spec_.maximum = v; return *this; }
  Opt& choices(std::vector<std::string> c) { spec_.choices = std::move(c); return *this; }
  Opt& keywords(std::vector<std::string> k) { spec_.keywords = std::move(k); return *this; }
  Opt& nullable() { spec_.nullable = true; return *this; }
  /// In effect only when `option` is `equals`; `action` is what a UI does meanwhile ("show":
  /// hide the field, "enable": grey it out).
  /// A setting configs carry whatever its switch says: unused, it is not warned about.
  Opt& quiet_when_unused() { spec_.warns_when_unused = false; return *this; }
  Opt& depends(std::string option, std::string equals, std::string action = "show") {
    spec_.depends_on.push_back({std::move(option), std::move(equals), std::move(action)});
    return *this;
  }
  /// Labels of the choices, for UIs and docs.
  Opt& labels(std::map<std::string, std::string> l) { spec_.choice_labels = std::move(l); return *this; }
  /// Another value name accepted for choice `current`.
  Opt& value_alias(std::string old, std::string current) {
    spec_.value_aliases[std::move(old)] = std::move(current);
    return *this;
  }
  /// A valid value whose training remat lacks (`needs` says what): an unsupported-computation
  /// error unless --ignore_unsupported_options.
  Opt& unsupported(std::string value, std::string needs) {
    spec_.unsupported_values[std::move(value)] = std::move(needs);
    return *this;
  }
  /// Values this build may lack (Note on OptionSpec::unavailable_value).
  Opt& unavailable(std::function<std::optional<std::string>(const std::string&)> needs) {
    spec_.unavailable_value = std::move(needs);
    return *this;
  }
  Opt& checkpointing() { spec_.checkpointing = true; return *this; }
  Opt& alias(std::string a) { spec_.aliases.push_back(std::move(a)); return *this; }
  Opt& default_note(std::string n) { spec_.default_note = std::move(n); return *this; }
  /// The valid choices depend on another option's value (model_flavour on model_family).
  Opt& choices_by(std::string option, std::map<std::string, std::vector<std::string>> by_value) {
    spec_.choices_depend_on = std::move(option);
    spec_.choices_by_value = std::move(by_value);
    return *this;
  }
  /// The whole text must match `regex`; `described` says what that means to a person.
  Opt& pattern(std::string regex, std::string described) {
    spec_.pattern = std::move(regex);
    spec_.pattern_description = std::move(described);
    return *this;
  }
  /// When both are set, this option's value must be >= `other`'s.
  Opt& at_least(std::string other) {
    spec_.relations.push_back({OptionRelation::Kind::AtLeast, std::move(other)});
    return *this;
  }
  /// Using the option (or `alias_name`, when given) gives a warning with `note`.
  Opt& deprecated(std::string note) { spec_.deprecated = std::move(note); return *this; }
  OptionSpec done() {
    spec_.default_value = spec_.render(TrainConfig{});
    return std::move(spec_);
  }

 private:
  OptionSpec spec_;
};

}  // namespace remat::train
