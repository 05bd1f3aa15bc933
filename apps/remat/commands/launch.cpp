// `remat launch`: starts this node's workers of a data-parallel job, each a `remat <command>`
// process with torchrun's environment (RANK, WORLD_SIZE, ...), so `remat train` needs neither
// torchrun nor Python. The process handling lives in launch/ (supervisor.h).
#include <filesystem>
#include <iostream>

#include "command.h"
#include "launch/launch_options.h"
#include "launch/supervisor.h"
#include "launch/worker_environment.h"
#include "remat/util/error.h"

namespace remat::cli {
namespace {

const char kHelp[] = R"HELP(usage: remat launch --nproc_per_node N [--nnodes M] [--node_rank K]
                    [--master_addr A] [--master_port P] -- <command> [options...]

Starts N workers on this node, each `remat <command> [options...]` (the same remat binary), for
a data-parallel job of M x N workers; `remat train` joins the job from the environment. The
flags and the environment are torchrun's (static rendezvous), so a job started with
`torchrun --no-python` behaves the same. Run it once on every node, each with its --node_rank.

options (also spelled with dashes, --nproc-per-node, and as --flag=value):
  --nproc_per_node N  workers on this node, in [1, 1024] (one per GPU; default 1)
  --nnodes M          nodes in the job, in [1, 65535] (default 1)
  --node_rank K       this node, in [0, M) (default 0); node 0 hosts the rendezvous store
  --master_addr A     the address of node 0, reachable from every node (default 127.0.0.1)
  --master_port P     a free port on node 0, in [1, 65535] (default 29500)
  -h, --help          this text

Each worker's environment, for local rank L in [0, N):
  RANK=K*N+L  WORLD_SIZE=M*N  LOCAL_RANK=L  LOCAL_WORLD_SIZE=N  GROUP_RANK=K
  MASTER_ADDR=A  MASTER_PORT=P  (the rest of the launcher's environment is passed on)

Output: every line a worker writes is copied to the launcher's stdout or stderr, the same
stream, prefixed with its rank ("[rank0]: ..."); lines are never mixed. A '\r' (a progress
bar's redraw) ends a line too. Workers read stdin from /dev/null.

Signals: Ctrl-C (SIGINT) and SIGTERM are forwarded to every worker (`remat train` saves a
checkpoint after the current step and exits); a second one is forwarded too (the trainer stops
at once); a third kills the workers (SIGKILL). Workers run in their own process groups, so a
Ctrl-C reaches them once, through the launcher; if the launcher is killed, they get SIGTERM.

Failures: when a worker exits with a non-zero code or is killed by a signal, the launcher names
its rank, pid and reason ("[launch] rank 1 (pid 1234) was killed by signal 9 (SIGKILL); stopping
the other 1 worker(s)"), sends SIGTERM to the others and, after 5 s, SIGKILL.

exit code: 0 when every worker exits 0; otherwise the first failed worker's exit code, or 128 +
its signal (137 for SIGKILL), like a shell; 127 when a worker cannot be started; 128 + the
signal when the launcher was interrupted (130 for Ctrl-C); 2 for a bad flag.

examples:
  remat launch --nproc_per_node 2 -- train --config config.json
  # two machines, two GPUs each (run on both, node_rank 0 on 10.0.0.1, 1 on the other):
  remat launch --nproc_per_node 2 --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 -- train --config config.json
)HELP";

bool is_loopback(const std::string& address) {
  return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

int run_launch(const std::vector<std::string>& args) {
  const launch::LaunchOptions options = launch::parse_launch_arguments(args);  // throws: exit 2
  if (options.help) {
    std::cout << kHelp;
    return 0;
  }
  // Checked here, not by each worker: one clear error instead of N, and no nested launchers.
  const std::string& command = options.command.front();
  if (command == "launch" || (command != "help" && commands().count(command) == 0)) {
    std::string valid = "help";
    for (const auto& entry : commands()) {
      if (entry.first != "launch") valid += ", " + entry.first;
    }
    throw_value_error("[launch] the command after -- must be a remat command other than launch, got '" +
                      command + "'; valid: " + valid);
  }
  if (options.nnodes > 1 && is_loopback(options.master_addr)) {
    std::cerr << "[launch] warning: --nnodes " << options.nnodes << " with --master_addr "
              << options.master_addr << ": other nodes cannot reach a loopback address; pass node 0's "
              << "address to every node\n";
  }
  // The same binary, whatever the name or PATH it was started by.
  const std::string executable = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::vector<std::string> base_env = launch::current_environment();
  const auto threads = launch::thread_default(base_env, options.nproc_per_node);
  if (threads) {
    std::cerr << "[launch] OMP_NUM_THREADS is not set: each of the " << options.nproc_per_node
              << " workers gets OMP_NUM_THREADS=1 (as torchrun does); set it, or pass "
              << "--torch_num_threads to train, for more\n";
  }
  std::vector<launch::WorkerSpec> workers;
  for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
    launch::WorkerSpec worker;
    worker.argv = {executable};
    worker.argv.insert(worker.argv.end(), options.command.begin(), options.command.end());
    auto variables = launch::worker_variables(options, local_rank);
    if (threads) variables.push_back(*threads);
    worker.env = launch::with_variables(base_env, variables);
    worker.rank = launch::global_rank(options, local_rank);
    workers.push_back(std::move(worker));
  }
  std::cerr << "[launch] starting " << options.nproc_per_node << " worker(s), ranks "
            << workers.front().rank << "-" << workers.back().rank << " of world size "
            << launch::world_size(options) << " (node " << options.node_rank << " of "
            << options.nnodes << "), master " << options.master_addr << ":" << options.master_port
            << std::endl;
  return launch::run_workers(workers);
}

REMAT_COMMAND("launch", "start N local workers of a data-parallel job (torchrun's environment)",
              run_launch);

}  // namespace
}  // namespace remat::cli
