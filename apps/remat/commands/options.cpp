// `remat options --json | --markdown`: exports the `remat train` options registry, as a
// JSON-schema-like document for web UIs and editors, or as the text of docs/OPTIONS.md.
#include <iostream>

#include "command.h"
#include "remat/train/options.h"

namespace remat::cli {
namespace {

const char* const kUsage =
    "usage: remat options --json | --markdown\n\n"
    "  --json      every `remat train` option as JSON (type, default, minimum/maximum, enum,\n"
    "              description, tooltip, dependsOn, docs anchor)\n"
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

REMAT_COMMAND("options", "print the `remat train` options as JSON (--json) or Markdown (--markdown)",
              run_options);

}  // namespace
}  // namespace remat::cli
