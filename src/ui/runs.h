#pragma once
// Training runs started from the UI: child processes of the remat binary (`remat train --config
// <workspace>/configs/<name>/config.json`, argv, never a shell), started in the workspace, their
// stdout and stderr captured to <workspace>/runs/<id>/log.txt.

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace remat::ui::detail {

struct Run {
  std::string id;
  std::string config_name;
  std::string config_path;
  std::string output_dir;  ///< absolute (the config's, relative to the workspace)
  std::string log_path;
  std::optional<int64_t> max_steps;  ///< max_train_steps when the config sets it
  pid_t pid = -1;
  bool running = true;
  bool stop_requested = false;
  /// The exit status, or 128 + the signal that ended it; unset while running, and for a run an
  /// earlier server recorded as running when it was killed (state "unknown").
  std::optional<int> exit_code;
  int64_t started_unix = 0;
};

class RunManager {
 public:
  /// `executable`: the remat binary runs execute. Lists the runs recorded in the workspace by
  /// earlier servers (runs/<id>/run.json) as they ended.
  RunManager(std::string workspace, std::string executable);
  /// Stops every running run (SIGINT: each saves a checkpoint) and waits for it.
  ~RunManager();

  /// Validates config `name` as `remat train` would and starts it. Throws
  /// train::ValidationErrors (every error) for an invalid config, NotFound for a missing one.
  std::string start(const std::string& config_name);
  /// SIGINT to a running run (the trainer saves a checkpoint after the current step). Returns
  /// whether it was running. Throws NotFound for an unknown id.
  bool stop(const std::string& id);
  /// A copy of run `id`. Throws NotFound.
  Run get(const std::string& id) const;
  /// Every run, this server's and those recorded by earlier ones, by id (oldest first).
  std::vector<Run> list() const;
  /// Sends SIGINT to every running run and waits up to `timeout_s` for them to exit.
  void stop_all(double timeout_s);

 private:
  void reap(std::string id, pid_t pid);
  void write_record(const Run& run) const;

  std::string workspace_;
  std::string executable_;
  mutable std::mutex mutex_;
  std::condition_variable exited_;
  std::map<std::string, Run> runs_;
  std::vector<std::thread> reapers_;
  int64_t sequence_ = 0;
};

/// The API's view of a run: {"id", "config_name", "state", "step", "max_steps", "eta_seconds",
/// "peak_bytes", "loss", "exit_code", "output_dir", "log_path", "checkpoints", "started_at"},
/// progress read from the run's metrics.jsonl.
nlohmann::json run_status_json(const Run& run);

}  // namespace remat::ui::detail
