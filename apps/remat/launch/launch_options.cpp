#include "launch/launch_options.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <optional>

#include "remat/util/error.h"

namespace remat::cli::launch {
namespace {

// torchrun spells its flags with underscores and accepts dashes too; both map to one name.
std::optional<std::string> canonical_flag(const std::string& flag) {
  static const char* const kFlags[] = {"nproc_per_node", "nnodes", "node_rank", "master_addr",
                                       "master_port"};
  if (flag.rfind("--", 0) != 0) return std::nullopt;
  std::string name = flag.substr(2);
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  for (const char* known : kFlags) {
    if (name == known) return name;
  }
  return std::nullopt;
}

// A whole decimal integer in [min, max]; anything else ("two", "2x", "", "1:4") is refused.
int parse_int(const std::string& flag, const std::string& text, long min, long max,
              const std::string& valid) {
  errno = 0;
  char* end = nullptr;
  const long value = text.empty() ? 0 : std::strtol(text.c_str(), &end, 10);
  const bool whole = !text.empty() && end && *end == '\0' && errno == 0 &&
                     (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-');
  if (!whole || value < min || value > max) {
    throw_value_error("[launch] --" + flag + " must be " + valid + ", got '" + text + "'");
  }
  return static_cast<int>(value);
}

}  // namespace

LaunchOptions parse_launch_arguments(const std::vector<std::string>& args) {
  LaunchOptions options;
  std::optional<std::string> node_rank_text;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "--help" || arg == "-h") {
      options.help = true;
      continue;
    }
    if (arg.empty() || arg[0] != '-') break;  // the command starts here, as with torchrun
    const size_t eq = arg.find('=');
    const std::string flag = arg.substr(0, eq);
    const std::optional<std::string> name = canonical_flag(flag);
    if (!name) {
      throw_value_error("[launch] unknown option '" + flag +
                        "'; valid: --nproc_per_node, --nnodes, --node_rank, --master_addr, "
                        "--master_port, --help (the command to run goes after --)");
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw_value_error("[launch] --" + *name + " needs a value");
    }
    if (*name == "nproc_per_node") {
      options.nproc_per_node = parse_int(*name, value, 1, 1024, "an integer in [1, 1024] (workers on this node)");
    } else if (*name == "nnodes") {
      options.nnodes = parse_int(*name, value, 1, 65535,
                                 "an integer in [1, 65535] (a fixed node count; elastic ranges such "
                                 "as 1:4 are not supported)");
    } else if (*name == "node_rank") {
      node_rank_text = value;  // checked against --nnodes, which may come later
    } else if (*name == "master_addr") {
      if (value.empty()) throw_value_error("[launch] --master_addr must be a host name or address, got ''");
      options.master_addr = value;
    } else {
      options.master_port = parse_int(*name, value, 1, 65535, "a port in [1, 65535]");
    }
  }
  if (node_rank_text) {
    options.node_rank = parse_int("node_rank", *node_rank_text, 0, options.nnodes - 1,
                                  "an integer in [0, " + std::to_string(options.nnodes - 1) +
                                      "] (below --nnodes " + std::to_string(options.nnodes) + ")");
  }
  options.command.assign(args.begin() + static_cast<long>(i), args.end());
  if (options.command.empty() && !options.help) {
    throw_value_error("[launch] a command to run is required after --, e.g. "
                      "`remat launch --nproc_per_node 2 -- train --config config.json`");
  }
  return options;
}

int global_rank(const LaunchOptions& options, int local_rank) {
  return options.node_rank * options.nproc_per_node + local_rank;
}

int world_size(const LaunchOptions& options) { return options.nnodes * options.nproc_per_node; }

}  // namespace remat::cli::launch
