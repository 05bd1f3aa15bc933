#pragma once
// The `remat` CLI is one executable with subcommands. Each subcommand lives in its own file under
// commands/ and registers itself with REMAT_COMMAND; main() only dispatches. The CLI holds no
// model or training logic: it parses, validates and calls the library.

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace remat::cli {

/// Exit code for bad input (a flag, a value, a file): the message names what was wrong.
inline constexpr int kExitUsage = 2;

struct Command {
  std::string summary;
  /// Runs with the arguments after the subcommand name; returns the process exit code.
  std::function<int(const std::vector<std::string>& args)> run;
};

/// All registered subcommands, by name.
std::map<std::string, Command>& commands();

struct CommandRegistration {
  CommandRegistration(const std::string& name, const std::string& summary,
                      std::function<int(const std::vector<std::string>&)> run) {
    commands()[name] = Command{summary, std::move(run)};
  }
};

}  // namespace remat::cli

#define REMAT_COMMAND_CONCAT2(a, b) a##b
#define REMAT_COMMAND_CONCAT(a, b) REMAT_COMMAND_CONCAT2(a, b)
/// Registers a subcommand: REMAT_COMMAND("demo", "one line summary", run_demo);
#define REMAT_COMMAND(name, summary, fn)                                                  \
  static ::remat::cli::CommandRegistration REMAT_COMMAND_CONCAT(remat_command_, __LINE__)( \
      name, summary, fn)
