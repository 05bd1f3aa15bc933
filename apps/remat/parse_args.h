#pragma once
// CLI11 parsing shared by the subcommands, and the one flag vocabulary of the CLI: SimpleTuner's
// option names (--model_family, --model_flavour, --lora_rank, --torch_num_threads ...) on every
// subcommand. Older spellings are accepted with a deprecation note.

#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "command.h"
#include "remat/train/options/options.h"

namespace remat::cli {

/// Old flag spellings and the names that replaced them.
inline const std::map<std::string, std::string>& deprecated_flags() {
  static const std::map<std::string, std::string> table = {
      {"--model", "--model_family"},       {"--family", "--model_family"},
      {"--preset", "--model_flavour"},     {"--config", "--pretrained_transformer_config"},
      {"--lora-rank", "--lora_rank"},      {"--lora-target", "--lora_target"},
      {"--threads", "--torch_num_threads"}, {"--num_threads", "--torch_num_threads"},
      {"--image-tokens", "--image_tokens"},
      {"--text-tokens", "--text_tokens"},  {"--joint-dim", "--joint_dim"},
      {"--pooled-dim", "--pooled_dim"},
  };
  return table;
}

/// `args` with deprecated spellings (--name or --name=value) replaced, one note each on stderr.
inline std::vector<std::string> rename_deprecated(const std::string& command,
                                                  const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const auto& arg : args) {
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const auto it = deprecated_flags().find(name);
    if (it == deprecated_flags().end() || arg.rfind("--", 0) != 0) {
      out.push_back(arg);
      continue;
    }
    std::cerr << "remat " << command << ": note: " << name << " is deprecated; use " << it->second << "\n";
    out.push_back(it->second + (eq == std::string::npos ? "" : arg.substr(eq)));
  }
  return out;
}

/// Parses `args` with `app` (deprecated spellings renamed first). Returns an exit code when the
/// command should stop: 0 after --help, kExitUsage (CLI11 has printed what was wrong) for bad
/// arguments; nullopt to go on.
inline std::optional<int> parse_or_exit(CLI::App& app, const std::vector<std::string>& args) {
  const std::vector<std::string> renamed = rename_deprecated(app.get_name(), args);
  std::vector<std::string> reversed(renamed.rbegin(), renamed.rend());  // CLI11 consumes from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  return std::nullopt;
}

/// Adds `--<name>` for an option of `remat train`'s registry, with the registry's help text and
/// its validation (type, range, choices), so every subcommand reads the option as training does.
template <typename T>
CLI::Option* add_registry_option(CLI::App& app, const std::string& name, T& variable) {
  const train::OptionSpec* spec = train::find_option(name);
  CLI::Option* option = app.add_option("--" + name, variable, spec ? spec->help : name);
  if (spec) {
    option->check(CLI::Validator(
        [spec](std::string& text) -> std::string {
          try {
            train::parse_option_value(*spec, text);
          } catch (const train::ValidationError& e) {
            return e.message();
          }
          return "";
        },
        train::option_type_name(spec->type)));
  }
  return option->capture_default_str();
}

/// `--skip_memory_check`: build the model even when memory admission (remat/train/memory/admission.h)
/// predicts it will not fit; the registry's help text.
inline CLI::Option* add_skip_memory_check(CLI::App& app, bool& skip) {
  const train::OptionSpec* spec = train::find_option("skip_memory_check");
  return app.add_flag("--skip_memory_check", skip, spec ? spec->help : "skip memory admission");
}

}  // namespace remat::cli
