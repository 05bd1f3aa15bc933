#pragma once
// The environment a worker starts with: the launcher's own, plus torchrun's contract (the
// variables remat::distributed::read_launch_environment and PyTorch programs read).

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launch/launch_options.h"

namespace remat::cli::launch {

/// torchrun's variables for this node's worker `local_rank`, in [0, nproc_per_node): RANK,
/// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node rank), MASTER_ADDR, MASTER_PORT.
std::vector<std::pair<std::string, std::string>> worker_variables(const LaunchOptions& options,
                                                                  int local_rank);

/// `base` ("KEY=VALUE" entries, such as the launcher's environ) with `variables` set: an entry
/// of `base` with the same key is replaced, so a RANK inherited from an outer launcher never wins.
std::vector<std::string> with_variables(const std::vector<std::string>& base,
                                        const std::vector<std::pair<std::string, std::string>>& variables);

/// torchrun's thread default: with more than one worker per node and no OMP_NUM_THREADS in `base`,
/// OMP_NUM_THREADS=1, so N workers on one machine do not each start a thread per core (on a CPU
/// run they would fight over the cores; on GPUs the host threads are idle anyway). Nothing when
/// the user set it or when there is one worker.
std::optional<std::pair<std::string, std::string>> thread_default(const std::vector<std::string>& base,
                                                                   int nproc_per_node);

/// The launcher's environment as "KEY=VALUE" entries.
std::vector<std::string> current_environment();

}  // namespace remat::cli::launch
