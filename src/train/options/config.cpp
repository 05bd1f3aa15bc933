// Reading `remat train` options from a config file (JSON, TOML or SimpleTuner's config.env) and
// the command line into a TrainConfig. Key handling follows SimpleTuner's
// cli_utils.mapping_to_cli_args: config keys may carry a leading "--", and the file is equivalent
// to the same flags written on the command line.
#include "json_file.h"
#include "string_helpers.h"
#include "remat/train/options/config.h"
#include "remat/train/options/config_text.h"

#include <cctype>
#include <cmath>
#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>
#include <limits>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "options/config_formats.h"
#include "remat/compat.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"
#include "remat/train/options/options.h"
#include "remat/train/options/safety_check.h"
#include "remat/train/options/simpletuner.h"

namespace remat::train {

ValidationError::ValidationError(std::string option, std::string value, const std::string& message)
    : c10::ValueError(message, compat::no_backtrace()), option_(std::move(option)), value_(std::move(value)) {}

Backend TrainConfig::checkpoint_backend() const {
  return CheckpointPlan::parse_backend_name(gradient_checkpointing_backend).first->backend();
}

bool TrainConfig::checkpoint_ffn_only() const {
  return CheckpointPlan::parse_backend_name(gradient_checkpointing_backend).second ==
         CheckpointScope::FeedForward;
}

CheckpointPlan TrainConfig::checkpoint_plan() const {
  return checkpoint_plan_for(*this, checkpointing_capabilities(model_family));
}

std::optional<SavedTensorOffload> TrainConfig::attention_offload() const {
  if (!gradient_checkpointing_offload_attention) return std::nullopt;
  return SavedTensorOffload{gradient_checkpointing_offload_prefetch};
}

bool TrainConfig::checkpoint_layout_planned() const {
  return gradient_checkpointing && interval_in_effect(*this, checkpointing_capabilities(model_family)).is_auto();
}

double TrainConfig::lora_alpha_value() const {
  return lora_alpha ? *lora_alpha : static_cast<double>(lora_rank);
}

int64_t TrainConfig::validation_interval() const {
  if (validation_step_interval) return *validation_step_interval;
  return validation_steps.value_or(100);
}

bool TrainConfig::validation_requested() const {
  return !validation_disable && (validation_prompt.has_value() || user_prompt_library.has_value());
}

uint64_t TrainConfig::validation_seed_value() const {
  if (validation_seed && *validation_seed != 0) return static_cast<uint64_t>(*validation_seed);
  return static_cast<uint64_t>(seed.value_or(0));
}

Environment::Environment()
    : cuda_available(torch::cuda::is_available()),
      cuda_devices(cuda_available ? static_cast<int64_t>(torch::cuda::device_count()) : 0) {}

ValidationErrors::ValidationErrors(std::vector<Diagnostic> errors)
    : ValidationError(errors.empty() ? std::string() : errors.front().option,
                      errors.empty() ? std::string() : errors.front().value,
                      [&] {
                        std::string all;
                        for (const auto& e : errors) all += (all.empty() ? "" : "\n") + e.message;
                        return all;
                      }()),
      errors_(std::move(errors)) {}

namespace {

std::string strip_dashes(std::string key) {
  const size_t n = key.find_first_not_of('-');
  return n == std::string::npos ? std::string() : key.substr(n);
}

bool is_bool_word(const std::string& s) {
  const std::string l = remat::detail::lower(s);
  return l == "true" || l == "false" || l == "1" || l == "0" || l == "yes" || l == "no" ||
         l == "on" || l == "off";
}

bool ends_with_ignoring_case(const std::string& s, const std::string& suffix) {
  return remat::detail::ends_with(remat::detail::lower(s), suffix);
}

// Adds one key of a config file. remat's options are stored under their canonical name; other
// keys as written (validation classifies them).
void add_value(OptionValues& values, const std::string& path, const std::string& raw_key,
               std::optional<std::string> value, bool nested) {
  const std::string key = strip_dashes(raw_key);
  const OptionSpec* spec = find_option(key);
  const std::string name = spec ? spec->name : key;
  if (values.count(name)) {
    throw ValidationError(name, raw_key,
                          "[train] " + name + " must be given once in " + path + ", got it again as '" + raw_key + "'");
  }
  if (nested && spec) {
    throw ValidationError(spec->name, value.value_or(""),
                          "[train] " + spec->name + " must be a single value (string, number, boolean or null), got " +
                              value.value_or(""));
  }
  values[name] = std::move(value);
}

// Note [Bounded JSON] (remat/util/bounded_json.h): a regular file (a FIFO would block) of bounded
// size, whatever its format.
std::string read_text(const std::string& path, const char* format) {
  try {
    return util::read_regular_file(path, util::kMaxJsonFileBytes, "train", "config");
  } catch (const c10::ValueError& e) {
    throw ValidationError("config", path, std::string("[train] config must be a readable ") + format +
                                              " file, got '" + path + "': " + e.what_without_backtrace());
  }
}

OptionValues read_json(const std::string& path) { return read_config_json_text(read_text(path, "JSON"), path); }

}  // namespace

OptionValues read_config_json_text(const std::string& text, const std::string& path) {
  nlohmann::json doc;
  try {
    doc = remat::detail::parse_json_text(text, "train", "config '" + path + "'");
  } catch (const c10::ValueError& e) {
    throw ValidationError("config", path, e.what_without_backtrace());
  }
  if (!doc.is_object()) {
    throw ValidationError("config", path,
                          "[train] config must be a JSON object of option values, got a " +
                              std::string(doc.type_name()) + " in '" + path + "'");
  }
  OptionValues values;
  for (const auto& [raw_key, value] : doc.items()) {
    if (value.is_null()) {
      add_value(values, path, raw_key, std::nullopt, false);
    } else if (value.is_string()) {
      add_value(values, path, raw_key, value.get<std::string>(), false);
    } else if (value.is_boolean() || value.is_number()) {
      add_value(values, path, raw_key, value.dump(), false);
    } else {
      add_value(values, path, raw_key, util::json_excerpt(value), true);
    }
  }
  return values;
}

namespace {

// SimpleTuner's config.env (helpers/configuration/env_file.py parse_env_file): `NAME=value`
// lines, optionally `export`ed, values optionally quoted, `NAME+=more` appending with a space.
OptionValues read_env(const std::string& path, std::vector<Diagnostic>* notes) {
  std::istringstream in(read_text(path, "config.env"));
  std::vector<std::pair<std::string, std::string>> entries;
  std::vector<std::string> malformed;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const auto trim = [](std::string s) {
      const size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
      return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
    };
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("export ", 0) == 0) line = trim(line.substr(7));
    const size_t append = line.find("+=");
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      malformed.push_back(std::to_string(number));
      continue;
    }
    const bool appending = append != std::string::npos && append < eq;
    std::string key = trim(line.substr(0, appending ? append : eq));
    std::string value = trim(line.substr(eq + 1));
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    auto it = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.first == key; });
    if (it == entries.end()) entries.emplace_back(key, value);
    else it->second = appending ? it->second + " " + value : value;
  }
  OptionValues values;
  std::vector<std::string> other;
  std::vector<std::string> extra_args;
  for (const auto& [key, value] : entries) {
    if (key == "TRAINER_EXTRA_ARGS") {
      std::istringstream words(value);
      for (std::string w; words >> w;) extra_args.push_back(w);
      continue;
    }
    const SimpleTunerEnvName* env = find_simpletuner_env_name(key);
    if (env == nullptr) {
      other.push_back(key);
      continue;
    }
    if (!env->value.empty()) {  // a switch such as USE_BITFIT=true -> layer_freeze_strategy=bitfit
      const std::string l = value;
      if (l == "true" || l == "True" || l == "1") add_value(values, path, env->option, env->value, false);
      continue;
    }
    add_value(values, path, env->option, value, false);
  }
  // SimpleTuner appends TRAINER_EXTRA_ARGS after the named variables: its flags win.
  const CommandLine extra = parse_command_line(extra_args);
  for (const auto& [key, value] : extra.values) values[key] = value;
  if (notes && !other.empty()) {
    std::string names;
    for (const auto& n : other) names += (names.empty() ? "" : ", ") + n;
    notes->push_back({Diagnostic::Severity::Warning, "config", path,
                      "[train] " + path + " sets " + names + ", which are not SimpleTuner's config.env option "
                      "names (SimpleTuner only exports them to the environment); remat ignores them"});
  }
  if (notes && !malformed.empty()) {
    std::string lines;
    for (const auto& n : malformed) lines += (lines.empty() ? "" : ", ") + n;
    notes->push_back({Diagnostic::Severity::Warning, "config", path,
                      "[train] " + path + ": skipped malformed lines " + lines + " (not NAME=value)"});
  }
  return values;
}

}  // namespace

OptionValues read_config_file(const std::string& path, std::vector<Diagnostic>* notes) {
  if (ends_with_ignoring_case(path, ".json")) return read_json(path);
  if (ends_with_ignoring_case(path, ".env")) return read_env(path, notes);
  if (ends_with_ignoring_case(path, ".toml")) {
    return read_toml_config(path, [&path](OptionValues& values, const std::string& key,
                                          std::optional<std::string> value, bool nested) {
      add_value(values, path, key, std::move(value), nested);
    });
  }
  throw ValidationError("config", path,
                        "[train] config must be a .json, .toml or .env file (SimpleTuner's config.json, "
                        "config.toml or config.env), got '" + path + "'");
}

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine cl;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      cl.help = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      throw ValidationError("", arg,
                            "[train] arguments must be options written --name=value or --name value, "
                            "got '" + arg + "'");
    }
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    std::optional<std::string> value;
    if (eq != std::string::npos) value = arg.substr(eq + 1);
    if (key == "config") {
      if (!value) {
        if (i + 1 >= args.size()) {
          throw ValidationError("config", "", "[train] --config must be followed by a path, got nothing");
        }
        value = args[++i];
      }
      cl.config_path = *value;
      continue;
    }
    const OptionSpec* spec = find_option(key);
    if (!spec) {
      // Not remat's: validation classifies it. Its value is the next word, if that is not a flag.
      if (!value) value = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0 ? args[++i] : "true";
      cl.values[key] = *value;
      continue;
    }
    if (!value) {
      if (spec->type == OptionType::Bool) {
        // `--flag` alone is true; `--flag false` (a separate bool word) is accepted too.
        if (i + 1 < args.size() && is_bool_word(args[i + 1])) value = args[++i];
        else value = "true";
      } else {
        if (i + 1 >= args.size()) {
          throw ValidationError(spec->name, "",
                                "[train] --" + spec->name + " must be followed by a value, got nothing");
        }
        value = args[++i];
      }
    }
    cl.values[spec->name] = *value;
  }
  return cl;
}

TrainConfig build_train_config(const OptionValues& values, std::vector<std::string>& warnings,
                               const Environment& env) {
  const ValidationReport report = validate_option_values(values, env, /*safety=*/false);
  if (!report.ok()) throw ValidationErrors(report.errors());
  for (const auto& w : report.warnings()) warnings.push_back(w);
  return report.config;
}

TrainConfig load_train_config(const std::vector<std::string>& args, std::vector<std::string>& warnings,
                              const Environment& env) {
  const CommandLine cl = parse_command_line(args);
  std::vector<Diagnostic> notes;
  OptionValues values;
  if (cl.config_path) values = read_config_file(*cl.config_path, &notes);
  for (const auto& [key, value] : cl.values) values[key] = value;  // flags override the file
  const ValidationReport report = validate_option_values(values, env);
  if (!report.ok()) throw ValidationErrors(report.errors());
  for (const auto& n : notes) warnings.push_back(n.message);
  for (const auto& w : report.warnings()) warnings.push_back(w);
  return report.config;
}

int64_t parse_bytes(const std::string& text, const std::string& option) {
  try {
    return parse_byte_size(text, option);
  } catch (const c10::ValueError& e) {
    throw ValidationError(option, text, std::string("[train] ") + e.what_without_backtrace());
  }
}

}  // namespace remat::train
