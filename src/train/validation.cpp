// Validation of `remat train` options: every problem at once, each naming its option. The rules
// come from the registry's metadata (types, ranges, choices per family, patterns, relations,
// depends_on, deprecations) and from the families (remat/train/family.h); the checkpointing
// safety check (safety_check.cpp) adds SimpleTuner's rules for the checkpointing options.
#include <algorithm>
#include <set>

#include <c10/util/Exception.h>

#include "remat/io/bounded_json.h"
#include "remat/train/config.h"
#include "remat/train/family.h"
#include "remat/train/options.h"
#include "remat/train/safety_check.h"

namespace remat::train {
namespace {

using Severity = Diagnostic::Severity;

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// The dependency `dep` of an option holds for `config`.
bool holds(const TrainConfig& config, const OptionDependency& dep) {
  const OptionSpec* spec = find_option(dep.option);
  return spec != nullptr && spec->render(config).value_or("") == dep.equals;
}

}  // namespace

std::string unknown_option_message(std::string_view name, const std::string& where) {
  // A key from a file may be megabytes long: the message quotes its head, and the edit distance
  // (quadratic) only compares a head no option name is longer than.
  const std::string_view head = name.substr(0, 200);
  return "[train] unknown option '" + io::text_excerpt(name) + "'" + where + " (did you mean '" +
         closest_option(head) + "'?)";
}

std::vector<Diagnostic> dependency_diagnostics(TrainConfig& config, bool checkpointing) {
  std::vector<Diagnostic> out;
  for (const OptionSpec& spec : option_specs()) {
    if (spec.checkpointing != checkpointing || spec.depends_on.empty()) continue;
    const std::optional<std::string> value = spec.render(config);
    if (value == spec.default_value) continue;
    for (const auto& dep : spec.depends_on) {
      if (holds(config, dep)) continue;
      const OptionSpec* on = find_option(dep.option);
      const std::string shown = value.value_or("unset");
      Diagnostic d{Severity::Warning, spec.name, shown, ""};
      if (on != nullptr && on->type == OptionType::Bool) {
        d.message = "[train] " + spec.name + "=" + shown + " has no effect because " + dep.option +
                    " is " + on->render(config).value_or("unset");
      } else {
        d.message = "[train] " + spec.name + "=" + shown + " is only used with " + dep.option + "=" +
                    dep.equals + "; ignoring it";
        spec.assign(config, parse_option_value(spec, spec.default_value));
      }
      out.push_back(std::move(d));
      break;  // one reason is enough
    }
  }
  return out;
}

std::vector<Diagnostic> relation_diagnostics(const TrainConfig& config, const std::string& name) {
  std::vector<Diagnostic> out;
  const OptionSpec* spec = find_option(name);
  if (spec == nullptr) return out;
  for (const auto& relation : spec->relations) {
    const OptionSpec* other = find_option(relation.option);
    const auto mine = spec->render(config);
    const auto theirs = other ? other->render(config) : std::nullopt;
    if (!mine || !theirs) continue;
    char* end = nullptr;
    const double a = std::strtod(mine->c_str(), &end);
    if (*end != '\0') continue;
    const double b = std::strtod(theirs->c_str(), &end);
    if (*end != '\0') continue;  // a keyword ("auto"): nothing to compare
    if (relation.kind == OptionRelation::Kind::AtLeast && a < b) {
      out.push_back({Severity::Error, spec->name, *mine,
                     "[train] " + spec->name + " must be >= " + other->name + " (" + *theirs +
                         "), got " + *mine});
    }
  }
  return out;
}

bool ValidationReport::ok() const {
  return std::none_of(diagnostics.begin(), diagnostics.end(),
                      [](const Diagnostic& d) { return d.severity == Severity::Error; });
}

std::vector<Diagnostic> ValidationReport::errors() const {
  std::vector<Diagnostic> out;
  for (const auto& d : diagnostics) {
    if (d.severity == Severity::Error) out.push_back(d);
  }
  return out;
}

std::vector<std::string> ValidationReport::warnings() const {
  std::vector<std::string> out;
  for (const auto& d : diagnostics) {
    if (d.severity == Severity::Warning) out.push_back(d.message);
  }
  return out;
}

ValidationReport validate_option_values(const OptionValues& values, const Environment& env, bool safety) {
  ValidationReport report;
  TrainConfig& config = report.config;
  auto& out = report.diagnostics;
  const auto error = [&](const std::string& option, const std::string& value, const std::string& message) {
    out.push_back({Severity::Error, option, value, message});
  };
  const auto warn = [&](const std::string& option, const std::string& value, const std::string& message) {
    out.push_back({Severity::Warning, option, value, message});
  };

  // 1. Each value on its own: a known option, its type, range, choices and pattern.
  std::set<std::string> refused;
  for (const auto& [key, text] : values) {
    const OptionSpec* spec = find_option(key);
    if (spec == nullptr) {
      error(key, text.value_or(""), unknown_option_message(key, ""));
      continue;
    }
    if (!spec->deprecated.empty()) {
      warn(spec->name, text.value_or(""), "[train] " + spec->name + " is deprecated: " + spec->deprecated);
    }
    try {
      spec->assign(config, parse_option_value(*spec, text));
    } catch (const ValidationError& e) {
      error(e.option(), e.value(), e.message());
      refused.insert(spec->name);
    }
  }

  // 2. The family: its default flavour, and choices that depend on it (model_flavour).
  const ModelFamily* family = refused.count("model_family") ? nullptr : find_model_family(config.model_family);
  if (family != nullptr && config.model_flavour.empty()) config.model_flavour = family->default_flavour;
  for (const OptionSpec& spec : option_specs()) {
    if (spec.choices_depend_on.empty() || refused.count(spec.name) || refused.count(spec.choices_depend_on)) {
      continue;
    }
    const auto value = spec.render(config);
    const OptionSpec* on = find_option(spec.choices_depend_on);
    const std::string on_value = on ? on->render(config).value_or("") : "";
    const auto allowed = spec.choices_by_value.find(on_value);
    if (!value || allowed == spec.choices_by_value.end()) continue;
    if (std::find(allowed->second.begin(), allowed->second.end(), *value) == allowed->second.end()) {
      error(spec.name, *value,
            "[train] " + spec.name + " must be one of " + join(allowed->second) + " for " +
                spec.choices_depend_on + " " + on_value + ", got '" + *value + "'");
      refused.insert(spec.name);
    }
  }

  // 3. Dependencies and relations of the options outside the checkpointing group (the safety
  //    check, below, covers that group with SimpleTuner's rules).
  for (auto& d : dependency_diagnostics(config, /*checkpointing=*/false)) out.push_back(std::move(d));
  for (const OptionSpec& spec : option_specs()) {
    if (spec.checkpointing || refused.count(spec.name)) continue;
    for (auto& d : relation_diagnostics(config, spec.name)) out.push_back(std::move(d));
  }

  // 4. What the environment decides.
  if (!config.lora_alpha) config.lora_alpha = static_cast<double>(config.lora_rank);
  if (config.device == "auto") {
    config.device = env.cuda_available ? "cuda" : "cpu";
  } else if (config.device.rfind("cuda", 0) == 0) {
    if (!env.cuda_available) {
      error("device", config.device,
            "[train] device must be cpu or auto on this machine (CUDA is not available), got '" +
                config.device + "'");
    } else if (config.device.size() > 5) {
      const int64_t index = std::stoll(config.device.substr(5));  // the pattern made it digits
      if (index >= env.cuda_devices) {
        error("device", config.device,
              "[train] device must be cuda:0 to cuda:" + std::to_string(env.cuda_devices - 1) +
                  " on this machine, got '" + config.device + "'");
      }
    }
  }
  if (family != nullptr && !config.pretrained_model_name_or_path) {
    warn("pretrained_model_name_or_path", "",
         "[train] pretrained_model_name_or_path is not set: the " + config.model_flavour +
             " transformer starts from random weights");
  }
  // SimpleTuner's normalize_lr_scheduler_value: a constant schedule with warmup is
  // constant_with_warmup.
  if (config.lr_scheduler == "constant" && config.lr_warmup_steps > 0) {
    config.lr_scheduler = "constant_with_warmup";
    warn("lr_scheduler", "constant",
         "[train] lr_scheduler constant with lr_warmup_steps " + std::to_string(config.lr_warmup_steps) +
             " is treated as constant_with_warmup");
  }

  // 5. The checkpointing safety check (SimpleTuner's rules, per family).
  if (safety && family != nullptr) {
    try {
      for (const auto& w : safety_check(config)) warn("", "", w);
    } catch (const ValidationErrors& e) {
      for (const auto& d : e.errors()) out.push_back(d);
    } catch (const ValidationError& e) {
      error(e.option(), e.value(), e.message());
    }
  }
  return report;
}

}  // namespace remat::train
