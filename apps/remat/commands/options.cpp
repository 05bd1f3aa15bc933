// `remat options --json | --markdown`: exports the `remat train` options registry, as a JSON
// Schema of a config file for web UIs and editors, or as the text of docs/OPTIONS.md.
#include <iostream>

#include "command.h"
#include "remat/train/options/options.h"

namespace remat::cli {
namespace {

const char* const kUsage =
    "usage: remat options --json | --markdown\n\n"
    "  --json      a JSON Schema (Draft 2020-12) of a `remat train` config file, with each\n"
    "              option's UI metadata (help, tooltip, section, order, dependencies, choice\n"
    "              labels, docs link) under x-remat\n"
    "  --markdown  the options reference (the text of docs/OPTIONS.md)\n";

int run_options(const std::vector<std::string>& args) {
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << kUsage;
    return 0;
  }
  if (args.size() == 1 && args[0] == "--json") {
    std::cout << train::options_json();
    return 0;
  }
  if (args.size() == 1 && args[0] == "--markdown") {
    std::cout << train::options_markdown();
    return 0;
  }
  std::cerr << "remat options: expected exactly one of --json or --markdown, got '";
  for (size_t i = 0; i < args.size(); ++i) std::cerr << (i ? " " : "") << args[i];
  std::cerr << "'\n\n" << kUsage;
  return kExitUsage;
}

REMAT_COMMAND("options", "print the `remat train` options as a JSON Schema (--json) or Markdown (--markdown)",
              run_options);

}  // namespace
}  // namespace remat::cli
