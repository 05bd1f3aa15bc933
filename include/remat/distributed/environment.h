#pragma once
/// \file
/// Where this process stands among the processes of one training run: torchrun's environment
/// contract, so `torchrun --no-python remat train ...`, accelerate, a Slurm script or
/// `remat launch` can start remat the way they start PyTorch programs.

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "remat/export.h"

namespace remat::distributed {

/// The default of SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS, as SimpleTuner has it.
inline constexpr int64_t kDefaultProcessGroupTimeoutSeconds = 5400;

/// This process's place in the run, read from the environment.
struct LaunchEnvironment {
  int rank = 0;              ///< RANK: 0 .. world_size - 1, unique over all machines
  int world_size = 1;        ///< WORLD_SIZE: processes in the run
  int local_rank = 0;        ///< LOCAL_RANK: index on this machine (picks the GPU)
  int local_world_size = 1;  ///< LOCAL_WORLD_SIZE: processes on this machine
  std::string master_addr = "127.0.0.1";  ///< MASTER_ADDR: where rank 0 listens
  int master_port = 29500;                ///< MASTER_PORT: rank 0's rendezvous port
  /// SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS: how long a rank waits for the others (at the
  /// rendezvous, in a collective) before failing with an error naming what it waited for.
  std::chrono::seconds timeout{kDefaultProcessGroupTimeoutSeconds};

  /// More than one process: gradients are synchronised.
  bool distributed() const { return world_size > 1; }
  bool is_main() const { return rank == 0; }
  /// "rank 1 of 2" (for messages).
  std::string describe() const;
};

/// Reads a variable; nullopt when unset. The default reads the process environment.
using EnvironmentReader = std::function<std::optional<std::string>(const std::string& name)>;

/// Reads torchrun's contract: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT, and SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS. WORLD_SIZE unset (or 1): a single
/// process, the other variables ignored except the timeout. Otherwise every variable but the
/// timeout and LOCAL_* (defaulting to RANK and WORLD_SIZE, one machine) must be set. Throws
/// c10::ValueError naming the variable, its value and what is valid (an integer, RANK within
/// [0, WORLD_SIZE), a port within [1, 65535], a positive timeout).
REMAT_API LaunchEnvironment read_launch_environment(const EnvironmentReader& read = {});

}  // namespace remat::distributed
