#pragma once
// CLI11 parsing shared by the subcommands.

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "command.h"

namespace remat::cli {

/// Parses `args` with `app`. Returns an exit code when the command should stop: 0 after --help,
/// kExitUsage (CLI11 has printed what was wrong) for bad arguments; nullopt to go on.
inline std::optional<int> parse_or_exit(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 consumes from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  return std::nullopt;
}

}  // namespace remat::cli
