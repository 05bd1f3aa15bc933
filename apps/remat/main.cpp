// remat: activation checkpointing for LibTorch, with Flux.1 / MageFlow training.
// Usage: remat <command> [options]; `remat help` lists the commands.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "command.h"
#include "remat/build_info.h"
#include "remat/memory.h"
#include "remat/out_of_memory.h"
#include "remat/train/options/config.h"

namespace remat::cli {

std::map<std::string, Command>& commands() {
  static std::map<std::string, Command> table;
  return table;
}

namespace {

void print_usage(std::ostream& out) {
  out << "usage: remat <command> [options]\n\ncommands:\n";
  for (const auto& [name, command] : commands()) {
    out << "  " << name << std::string(name.size() < 18 ? 18 - name.size() : 1, ' ')
        << command.summary << "\n";
  }
  out << "\n`remat <command> --help` describes a command's options; `remat --version` the build.\n";
}

}  // namespace
}  // namespace remat::cli

int main(int argc, char** argv) {
  using namespace remat::cli;
  // Count every CPU tensor from the start: peak-memory figures are part of every report.
  remat::memory::install_cpu_tracking();
  // Freed tensors' memory is reused, not faulted back in page by page each step.
  remat::memory::reuse_freed_host_memory();
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help" ||
      std::string(argv[1]) == "-h") {
    print_usage(std::cout);
    return argc < 2 ? kExitUsage : 0;
  }
  const std::string name = argv[1];
  if (name == "--version" || name == "version") {
    std::cout << remat::describe(remat::build_info());
    return 0;
  }
  auto it = commands().find(name);
  if (it == commands().end()) {
    std::cerr << "remat: unknown command '" << name << "'\n\n";
    print_usage(std::cerr);
    return kExitUsage;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return it->second.run(args);
  } catch (const remat::train::ValidationErrors& e) {
    // Every problem found, one per line, so all can be fixed in one go.
    for (const auto& error : e.errors()) std::cerr << "remat " << name << ": error: " << error.message << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    // One rule for what a library throws past every stage that could name it: out of memory is
    // remat's [memory] error (remat/out_of_memory.h), a filesystem error names its path, and
    // c10 errors are remat's own convention (remat/util/error.h). All are exit code 2.
    if (const auto bytes = remat::memory::failed_allocation_bytes(e)) {
      std::cerr << "remat " << name << ": error: "
                << remat::memory::out_of_memory_message("`remat " + name + "`",
                                                        "lower the resolution, batch size or picture size it works on",
                                                        *bytes)
                << "\n";
      return kExitUsage;
    }
    if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
      std::cerr << "remat " << name << ": error: " << error->what_without_backtrace() << "\n";
      return kExitUsage;
    }
    if (const auto* error = dynamic_cast<const std::filesystem::filesystem_error*>(&e)) {
      std::cerr << "remat " << name << ": error: [filesystem] '" << error->path1().string()
                << "': " << error->code().message() << "\n";
      return kExitUsage;
    }
    std::cerr << "remat " << name << ": error: " << e.what() << "\n";
    return 1;
  }
}
