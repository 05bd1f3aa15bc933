// Reading `remat train` options from a config.json and the command line into a TrainConfig.
// Key handling follows SimpleTuner's cli_utils.mapping_to_cli_args: config keys may carry a
// leading "--", and the file is equivalent to the same flags written on the command line.
#include "remat/train/config.h"

#include <cctype>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "remat/io/bounded_json.h"
#include "remat/io/files.h"
#include "remat/train/options.h"
#include "remat/train/safety_check.h"

namespace remat::train {

ValidationError::ValidationError(std::string option, std::string value, const std::string& message)
    : c10::ValueError(message, /*backtrace=*/""), option_(std::move(option)), value_(std::move(value)) {}

Backend TrainConfig::checkpoint_backend() const {
  return CheckpointPlan::parse_backend_name(gradient_checkpointing_backend).first->backend();
}

bool TrainConfig::checkpoint_ffn_only() const {
  return CheckpointPlan::parse_backend_name(gradient_checkpointing_backend).second ==
         CheckpointScope::FeedForward;
}

CheckpointPlan TrainConfig::checkpoint_plan() const {
  return CheckpointPlan::simpletuner(gradient_checkpointing, gradient_checkpointing_interval,
                                     gradient_checkpointing_segment_stride,
                                     gradient_checkpointing_backend);
}

double TrainConfig::lora_alpha_value() const {
  return lora_alpha ? *lora_alpha : static_cast<double>(lora_rank);
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
  std::string l;
  for (char c : s) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return l == "true" || l == "false" || l == "1" || l == "0" || l == "yes" || l == "no" ||
         l == "on" || l == "off";
}

}  // namespace

OptionValues read_config_file(const std::string& path, std::vector<Diagnostic>* unknown) {
  // Note [Bounded JSON] (remat/io/bounded_json.h): a regular file (a FIFO would block) of bounded
  // size and depth, and messages that quote excerpts of values.
  std::string text;
  try {
    text = io::read_regular_file(path, io::kMaxJsonFileBytes, "train", "config");
  } catch (const c10::ValueError& e) {
    throw ValidationError("config", path, "[train] config must be a readable JSON file, got '" + path +
                                              "': " + e.what_without_backtrace());
  }
  nlohmann::json doc;
  try {
    io::check_json_text(text, io::kMaxJsonFileBytes, "[train] config '" + path + "'");
    doc = nlohmann::json::parse(text);
  } catch (const c10::ValueError& e) {
    throw ValidationError("config", path, e.what_without_backtrace());
  } catch (const nlohmann::json::exception& e) {
    throw ValidationError("config", path,
                          "[train] config must be valid JSON, got '" + path +
                              "': " + io::text_excerpt(e.what(), 2 * io::kExcerptChars));
  }
  if (!doc.is_object()) {
    throw ValidationError("config", path,
                          "[train] config must be a JSON object of option values, got a " +
                              std::string(doc.type_name()) + " in '" + path + "'");
  }
  OptionValues values;
  for (const auto& [raw_key, value] : doc.items()) {
    const std::string key = strip_dashes(raw_key);
    const OptionSpec* spec = find_option(key);
    if (!spec) {
      Diagnostic d{Diagnostic::Severity::Error, key, "", unknown_option_message(key, " in " + path)};
      if (!unknown) throw ValidationError(d.option, d.value, d.message);
      unknown->push_back(std::move(d));
      continue;
    }
    if (values.count(spec->name)) {
      throw ValidationError(spec->name, raw_key,
                            "[train] " + spec->name + " must be given once in " + path + ", got it again as '" +
                                raw_key + "'");
    }
    if (value.is_null()) {
      values[spec->name] = std::nullopt;
    } else if (value.is_string()) {
      values[spec->name] = value.get<std::string>();
    } else if (value.is_boolean() || value.is_number()) {
      values[spec->name] = value.dump();
    } else {
      const std::string shown = io::json_excerpt(value);
      throw ValidationError(spec->name, shown,
                            "[train] " + spec->name + " must be a single value (string, number, boolean or "
                            "null), got " + shown);
    }
  }
  return values;
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
      // Reported with every other problem; an unknown flag's value is the next word, if any.
      if (!value && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) value = args[++i];
      cl.unknown.push_back({Diagnostic::Severity::Error, key, value.value_or(""),
                            unknown_option_message(key, " on the command line")});
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
  std::vector<Diagnostic> unknown;
  OptionValues values;
  if (cl.config_path) values = read_config_file(*cl.config_path, &unknown);
  unknown.insert(unknown.end(), cl.unknown.begin(), cl.unknown.end());
  for (const auto& [key, value] : cl.values) values[key] = value;
  const ValidationReport report = validate_option_values(values, env);
  std::vector<Diagnostic> errors = unknown;
  for (auto& e : report.errors()) errors.push_back(std::move(e));
  if (!errors.empty()) throw ValidationErrors(std::move(errors));
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
