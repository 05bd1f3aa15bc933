// Reading `remat train` options from a config.json and the command line into a TrainConfig.
// Key handling follows SimpleTuner's cli_utils.mapping_to_cli_args: config keys may carry a
// leading "--", and the file is equivalent to the same flags written on the command line.
#include "remat/train/config.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "remat/train/options.h"
#include "remat/train/safety_check.h"

namespace remat::train {

ValidationError::ValidationError(std::string option, std::string value, const std::string& message)
    : std::invalid_argument(message), option_(std::move(option)), value_(std::move(value)) {}

Backend TrainConfig::checkpoint_backend() const {
  return gradient_checkpointing_backend.rfind("unsloth", 0) == 0 ? Backend::Offload : Backend::Recompute;
}

bool TrainConfig::checkpoint_ffn_only() const {
  const std::string suffix = "-ffn";
  const auto& b = gradient_checkpointing_backend;
  return b.size() >= suffix.size() && b.compare(b.size() - suffix.size(), suffix.size(), suffix) == 0;
}

double TrainConfig::lora_alpha_value() const {
  return lora_alpha ? *lora_alpha : static_cast<double>(lora_rank);
}

Environment::Environment() : cuda_available(torch::cuda::is_available()) {}

namespace {

const OptionSpec& known_option(const std::string& key, const std::string& where) {
  const OptionSpec* spec = find_option(key);
  if (!spec) {
    throw ValidationError(key, "",
                          "[train] unknown option '" + key + "'" + where + " (did you mean '" +
                              closest_option(key) + "'?)");
  }
  return *spec;
}

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

// The preset name's prefix is its family ("flux-dev" belongs to "flux").
bool flavour_of_family(const std::string& flavour, const std::string& family) {
  return flavour.rfind(family + "-", 0) == 0;
}

std::string family_default_flavour(const std::string& family) {
  return family == "mageflow" ? "mageflow-4b" : "flux-dev";
}

}  // namespace

OptionValues read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw ValidationError("config", path, "[train] config must be a readable JSON file, got '" + path + "'");
  }
  nlohmann::json doc;
  try {
    in >> doc;
  } catch (const nlohmann::json::exception& e) {
    throw ValidationError("config", path,
                          "[train] config must be valid JSON, got '" + path + "': " + e.what());
  }
  if (!doc.is_object()) {
    throw ValidationError("config", path,
                          "[train] config must be a JSON object of option values, got a " +
                              std::string(doc.type_name()) + " in '" + path + "'");
  }
  OptionValues values;
  for (const auto& [raw_key, value] : doc.items()) {
    const OptionSpec& spec = known_option(strip_dashes(raw_key), " in " + path);
    if (values.count(spec.name)) {
      throw ValidationError(spec.name, raw_key,
                            "[train] " + spec.name + " must be given once in " + path + ", got it again as '" +
                                raw_key + "'");
    }
    if (value.is_null()) {
      values[spec.name] = std::nullopt;
    } else if (value.is_string()) {
      values[spec.name] = value.get<std::string>();
    } else if (value.is_boolean() || value.is_number()) {
      values[spec.name] = value.dump();
    } else {
      throw ValidationError(spec.name, value.dump(),
                            "[train] " + spec.name + " must be a single value (string, number, boolean or "
                            "null), got " + value.dump());
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
    const OptionSpec& spec = known_option(key, " on the command line");
    if (!value) {
      if (spec.type == OptionType::Bool) {
        // `--flag` alone is true; `--flag false` (a separate bool word) is accepted too.
        if (i + 1 < args.size() && is_bool_word(args[i + 1])) value = args[++i];
        else value = "true";
      } else {
        if (i + 1 >= args.size()) {
          throw ValidationError(spec.name, "",
                                "[train] --" + spec.name + " must be followed by a value, got nothing");
        }
        value = args[++i];
      }
    }
    cl.values[spec.name] = *value;
  }
  return cl;
}

TrainConfig build_train_config(const OptionValues& values, std::vector<std::string>& warnings,
                               const Environment& env) {
  TrainConfig config;
  for (const auto& [key, text] : values) {
    const OptionSpec& spec = known_option(key, "");
    spec.assign(config, parse_option_value(spec, text));
  }

  // Cross-option rules the per-value checks cannot see.
  if (config.model_flavour.empty()) {
    config.model_flavour = family_default_flavour(config.model_family);
  } else if (!flavour_of_family(config.model_flavour, config.model_family)) {
    std::string valid;
    for (const auto& c : find_option("model_flavour")->choices) {
      if (flavour_of_family(c, config.model_family)) valid += (valid.empty() ? "" : ", ") + c;
    }
    throw ValidationError("model_flavour", config.model_flavour,
                          "[train] model_flavour must be one of " + valid + " for model_family " +
                              config.model_family + ", got '" + config.model_flavour + "'");
  }
  if (!config.lora_alpha) config.lora_alpha = static_cast<double>(config.lora_rank);
  if (config.device == "auto") {
    config.device = env.cuda_available ? "cuda" : "cpu";
  } else if (config.device == "cuda" && !env.cuda_available) {
    throw ValidationError("device", "cuda",
                          "[train] device must be cpu or auto on this machine (CUDA is not available), "
                          "got 'cuda'");
  }
  if (!config.pretrained_model_name_or_path) {
    warnings.push_back("[train] pretrained_model_name_or_path is not set: the " + config.model_flavour +
                       " transformer starts from random weights");
  }
  // SimpleTuner's normalize_lr_scheduler_value: a constant schedule with warmup is
  // constant_with_warmup.
  if (config.lr_scheduler == "constant" && config.lr_warmup_steps > 0) {
    config.lr_scheduler = "constant_with_warmup";
    warnings.push_back("[train] lr_scheduler constant with lr_warmup_steps " +
                       std::to_string(config.lr_warmup_steps) + " is treated as constant_with_warmup");
  }
  return config;
}

TrainConfig load_train_config(const std::vector<std::string>& args, std::vector<std::string>& warnings,
                              const Environment& env) {
  const CommandLine cl = parse_command_line(args);
  OptionValues values;
  if (cl.config_path) values = read_config_file(*cl.config_path);
  for (const auto& [key, value] : cl.values) values[key] = value;
  TrainConfig config = build_train_config(values, warnings, env);
  const auto safety = safety_check(config);
  warnings.insert(warnings.end(), safety.begin(), safety.end());
  return config;
}

// ---- byte sizes ----

int64_t parse_bytes(const std::string& text, const std::string& option) {
  const auto fail = [&]() -> ValidationError {
    return ValidationError(option, text,
                           "[train] " + option + " must be a byte size such as 20GiB, 512MiB, 1.5GB or "
                           "1048576 (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), got '" + text + "'");
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t number_begin = i;
  bool digits = false, dot = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) digits = true;
    else if (c == '.' && !dot) dot = true;
    else break;
  }
  if (!digits) throw fail();
  const long double number = std::strtold(text.substr(number_begin, i - number_begin).c_str(), nullptr);
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size() && !std::isspace(static_cast<unsigned char>(text[i])); ++i) {
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) throw fail();

  long double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kib") scale = 1024.0L;
  else if (unit == "m" || unit == "mib") scale = 1024.0L * 1024;
  else if (unit == "g" || unit == "gib") scale = 1024.0L * 1024 * 1024;
  else if (unit == "t" || unit == "tib") scale = 1024.0L * 1024 * 1024 * 1024;
  else if (unit == "kb") scale = 1e3L;
  else if (unit == "mb") scale = 1e6L;
  else if (unit == "gb") scale = 1e9L;
  else if (unit == "tb") scale = 1e12L;
  else throw fail();
  if (scale == 1 && dot) {
    throw ValidationError(option, text,
                          "[train] " + option + " must be a whole number of bytes when no unit is given, got '" +
                              text + "'");
  }
  const long double bytes = std::floor(number * scale);
  if (bytes > static_cast<long double>(std::numeric_limits<int64_t>::max())) {
    throw ValidationError(option, text,
                          "[train] " + option + " must be at most 8EiB (2^63-1 bytes), got '" + text + "'");
  }
  return static_cast<int64_t>(bytes);
}

std::string format_byte_size(int64_t bytes) {
  static const std::pair<const char*, int64_t> kUnits[] = {
      {"TiB", int64_t{1} << 40}, {"GiB", int64_t{1} << 30}, {"MiB", int64_t{1} << 20}, {"KiB", int64_t{1} << 10}};
  for (const auto& [name, size] : kUnits) {
    if (bytes != 0 && bytes % size == 0) return std::to_string(bytes / size) + name;
  }
  return std::to_string(bytes);
}

}  // namespace remat::train
