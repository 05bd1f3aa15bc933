#pragma once
// `remat launch`'s flags: torchrun's names and defaults for a static (fixed-size) job, parsed and
// validated before any worker starts.

#include <string>
#include <vector>

namespace remat::cli::launch {

/// One node's share of a job of nnodes x nproc_per_node workers (torchrun's static rendezvous:
/// every node is started by hand with its node_rank; rank 0 hosts the store at master_addr).
struct LaunchOptions {
  int nproc_per_node = 1;              ///< workers on this node (LOCAL_WORLD_SIZE), in [1, 1024]
  int nnodes = 1;                      ///< nodes in the job, in [1, 65535]
  int node_rank = 0;                   ///< this node, in [0, nnodes) (GROUP_RANK)
  std::string master_addr = "127.0.0.1";  ///< the address of node 0 (MASTER_ADDR)
  int master_port = 29500;             ///< a free port on node 0 (MASTER_PORT), in [1, 65535]
  std::vector<std::string> command;    ///< what each worker runs (after `--`), non-empty
  bool help = false;                   ///< --help / -h: print the help, start nothing
};

/// Parses `remat launch`'s arguments: --nproc_per_node N, --nnodes M, --node_rank K,
/// --master_addr A, --master_port P (also with dashes, --nproc-per-node, and as --flag=value),
/// then the command: everything after `--`, or from the first argument that is not a flag.
/// Throws c10::ValueError ("[launch] ...", naming the flag, the value and what is valid) for an
/// unknown flag, a missing or out-of-range value or a missing command (unless --help).
LaunchOptions parse_launch_arguments(const std::vector<std::string>& args);

/// The global rank of this node's worker `local_rank`: node_rank * nproc_per_node + local_rank.
int global_rank(const LaunchOptions& options, int local_rank);

/// The number of workers in the whole job: nnodes * nproc_per_node.
int world_size(const LaunchOptions& options);

}  // namespace remat::cli::launch
