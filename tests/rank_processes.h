#pragma once
// Starting the processes of a multi-process run from a test: torchrun's environment for each
// rank, output to a log file per rank, waits with a deadline (a hung rank fails the test rather
// than hanging it).

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <sys/types.h>

namespace remat::testing {

/// A free TCP port on 127.0.0.1 (bound to port 0 and released; free for the moment after).
int free_port();

struct RankProcess {
  int rank = 0;
  pid_t pid = -1;
  std::string log_path;
};

struct RankExit {
  int exit_code = -1;     ///< when it exited
  int signal = 0;         ///< when a signal ended it
  bool timed_out = false; ///< still running at the deadline (then killed)
  double seconds = 0;     ///< from the wait's start to the exit
  std::string log;        ///< its stdout and stderr
};

/// Starts `program args...` as rank `rank` of `world` (RANK, WORLD_SIZE, LOCAL_RANK,
/// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=port, plus `env`), output to `log_path`.
RankProcess start_rank(const std::string& program, const std::vector<std::string>& args, int rank, int world,
                       int port, const std::string& log_path, const std::map<std::string, std::string>& env = {});

/// Waits for the process to end, at most `deadline`; kills it (SIGKILL) past that.
RankExit wait_rank(const RankProcess& process, std::chrono::seconds deadline);

/// Starts `world` ranks with the same arguments, waits for all, returns their exits in rank order.
std::vector<RankExit> run_ranks(const std::string& program, const std::vector<std::string>& args, int world,
                                const std::string& log_dir, std::chrono::seconds deadline,
                                const std::map<std::string, std::string>& env = {});

/// The whole text of a file ("" when missing).
std::string read_text(const std::string& path);

}  // namespace remat::testing
