#include "launch/worker_environment.h"

#include <set>

extern char** environ;

namespace remat::cli::launch {

std::vector<std::pair<std::string, std::string>> worker_variables(const LaunchOptions& options,
                                                                  int local_rank) {
  return {
      {"RANK", std::to_string(global_rank(options, local_rank))},
      {"WORLD_SIZE", std::to_string(world_size(options))},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(options.master_port)},
  };
}

std::vector<std::string> with_variables(const std::vector<std::string>& base,
                                        const std::vector<std::pair<std::string, std::string>>& variables) {
  std::set<std::string> keys;
  for (const auto& variable : variables) keys.insert(variable.first);
  std::vector<std::string> out;
  for (const auto& entry : base) {
    if (keys.count(entry.substr(0, entry.find('='))) == 0) out.push_back(entry);
  }
  for (const auto& [key, value] : variables) out.push_back(key + "=" + value);
  return out;
}

std::optional<std::pair<std::string, std::string>> thread_default(const std::vector<std::string>& base,
                                                                   int nproc_per_node) {
  if (nproc_per_node <= 1) return std::nullopt;
  for (const auto& entry : base) {
    if (entry.rfind("OMP_NUM_THREADS=", 0) == 0) return std::nullopt;
  }
  return std::make_pair(std::string("OMP_NUM_THREADS"), std::string("1"));
}

std::vector<std::string> current_environment() {
  std::vector<std::string> out;
  for (char** entry = environ; entry && *entry; ++entry) out.emplace_back(*entry);
  return out;
}

}  // namespace remat::cli::launch
