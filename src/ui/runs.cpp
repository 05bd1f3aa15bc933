#include "runs.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "api.h"
#include "remat/util/child_process.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"
#include "remat/train/options/config.h"
#include "workspace.h"

namespace remat::ui::detail {
namespace fs = std::filesystem;

namespace {

std::string new_run_id(int64_t sequence) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  return std::string(stamp) + "-" + std::to_string(sequence);
}

const char* state_name(const Run& run) {
  if (run.running) return "running";
  // A run recorded as running by a server that was killed: how it ended is not known.
  if (!run.exit_code) return "unknown";
  const int code = *run.exit_code;
  // The trainer exits with 128 + SIGINT after saving its checkpoint (0 when the last step came first).
  if (run.stop_requested && (code == 0 || code == 128 + SIGINT || code == 128 + SIGTERM)) return "stopped";
  return code == 0 ? "finished" : "failed";
}

}  // namespace

RunManager::RunManager(std::string workspace, std::string executable)
    : workspace_(std::move(workspace)), executable_(std::move(executable)) {
  // The runs of earlier servers on this workspace, from their runs/<id>/run.json, as they ended.
  std::error_code ec;
  for (fs::directory_iterator it(fs::path(workspace_) / "runs", ec), end; !ec && it != end; it.increment(ec)) {
    try {
      const std::string id = it->path().filename().string();
      check_config_name(id);  // ids are made of the same characters as config names
      const std::string text = util::read_regular_file((it->path() / "run.json").string(), util::kMaxJsonFileBytes,
                                                     "ui", "run record");
      util::check_json_text(text, util::kMaxJsonFileBytes, "[ui] run record");
      const nlohmann::json record = nlohmann::json::parse(text);
      Run run;
      run.id = id;
      run.config_name = record.value("config_name", "");
      run.config_path = record.value("config_path", "");
      run.output_dir = record.value("output_dir", "");
      run.log_path = (it->path() / "log.txt").string();
      if (record.contains("max_steps") && record["max_steps"].is_number_integer()) {
        run.max_steps = record["max_steps"].get<int64_t>();
      }
      if (record.contains("exit_code") && record["exit_code"].is_number_integer()) {
        run.exit_code = record["exit_code"].get<int>();
      }
      run.stop_requested = record.value("stop_requested", false);
      run.started_unix = record.value("started_at", int64_t{0});
      run.running = false;
      runs_[run.id] = run;
    } catch (const std::exception&) {
      // Not a run record of ours (a stray folder, a damaged file): not listed.
    }
  }
}

RunManager::~RunManager() {
  stop_all(120.0);
  for (auto& t : reapers_) t.join();
}

std::string RunManager::start(const std::string& config_name) {
  check_config_name(config_name);
  const std::string dir = confined_existing_path(workspace_, "configs/" + config_name);
  const std::string config_path = dir + "/config.json";
  if (!fs::is_regular_file(config_path)) throw NotFound("[ui] no config named '" + config_name + "'");
  // The validation `remat train --config` runs first, so a bad config is answered here with
  // every error instead of a failed run.
  const train::ValidationReport report = train::validate_option_values(train::read_config_file(config_path));
  if (!report.ok()) throw train::ValidationErrors(report.errors());

  Run run;
  run.config_name = config_name;
  run.config_path = config_path;
  const fs::path output = report.config.output_dir;
  run.output_dir = (output.is_absolute() ? output : fs::path(workspace_) / output).lexically_normal().string();
  if (!run.output_dir.empty() && run.output_dir.back() == '/') run.output_dir.pop_back();
  if (report.config.max_train_steps > 0) run.max_steps = report.config.max_train_steps;
  run.started_unix = static_cast<int64_t>(std::time(nullptr));

  std::unique_lock<std::mutex> lock(mutex_);
  do {
    run.id = new_run_id(++sequence_);
  } while (fs::exists(fs::path(workspace_) / "runs" / run.id));
  const fs::path run_dir = fs::path(workspace_) / "runs" / run.id;
  fs::create_directories(run_dir);
  run.log_path = (run_dir / "log.txt").string();

  const int log_fd = ::open(run.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (log_fd < 0 || null_fd < 0) {
    if (log_fd >= 0) ::close(log_fd);
    if (null_fd >= 0) ::close(null_fd);
    throw_value_error("[ui] cannot create the run's log file '" + run.log_path + "'");
  }
  util::ChildSpec spec;
  spec.argv = {executable_, "train", "--config", config_path};
  spec.directory = workspace_;
  spec.stdin_fd = null_fd;
  spec.stdout_fd = log_fd;
  spec.stderr_fd = log_fd;
  // No parent-death signal: a training run may outlive the server that started it.
  pid_t pid = -1;
  try {
    pid = util::start_child(spec, "ui");
  } catch (...) {
    ::close(log_fd);
    ::close(null_fd);
    throw;
  }
  ::close(log_fd);
  ::close(null_fd);
  run.pid = pid;
  runs_[run.id] = run;
  write_record(run);
  reapers_.emplace_back([this, id = run.id, pid] { reap(id, pid); });
  return run.id;
}

void RunManager::reap(std::string id, pid_t pid) {
  int status = 0;
  pid_t got;
  do {
    got = ::waitpid(pid, &status, 0);
  } while (got < 0 && errno == EINTR);
  std::lock_guard<std::mutex> lock(mutex_);
  Run& run = runs_.at(id);
  run.running = false;
  if (got == pid) run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  write_record(run);
  exited_.notify_all();
}

bool RunManager::stop(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = runs_.find(id);
  if (it == runs_.end()) throw NotFound("[ui] no run with id '" + util::text_excerpt(id) + "'");
  Run& run = it->second;
  if (!run.running) return false;
  // Only the first request signals: a second SIGINT would abort the trainer's checkpoint.
  if (!run.stop_requested) ::kill(run.pid, SIGINT);
  run.stop_requested = true;
  return true;
}

Run RunManager::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = runs_.find(id);
  if (it == runs_.end()) throw NotFound("[ui] no run with id '" + util::text_excerpt(id) + "'");
  return it->second;
}

std::vector<Run> RunManager::list() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Run> out;
  for (const auto& entry : runs_) out.push_back(entry.second);
  return out;
}

void RunManager::stop_all(double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (auto& entry : runs_) {
    Run& run = entry.second;
    if (run.running && !run.stop_requested) ::kill(run.pid, SIGINT);
    if (run.running) run.stop_requested = true;
  }
  const auto none_running = [this] {
    return std::none_of(runs_.begin(), runs_.end(), [](const auto& e) { return e.second.running; });
  };
  if (!exited_.wait_for(lock, std::chrono::duration<double>(timeout_s), none_running)) {
    for (auto& entry : runs_) {
      if (entry.second.running) ::kill(entry.second.pid, SIGKILL);
    }
    exited_.wait(lock, none_running);
  }
}

// runs/<id>/run.json: what the run was, for people looking at the workspace later.
void RunManager::write_record(const Run& run) const {
  nlohmann::json record = {{"id", run.id},           {"config_name", run.config_name}, {"config_path", run.config_path},
                           {"output_dir", run.output_dir}, {"pid", run.pid},            {"state", state_name(run)},
                           {"started_at", run.started_unix}, {"stop_requested", run.stop_requested}};
  if (run.exit_code) record["exit_code"] = *run.exit_code;
  if (run.max_steps) record["max_steps"] = *run.max_steps;
  try {
    util::write_file_atomically((fs::path(workspace_) / "runs" / run.id / "run.json").string(), record.dump(2) + "\n",
                              "ui");
  } catch (const std::exception&) {
    // The record is for people; the run goes on without it.
  }
}

nlohmann::json run_status_json(const Run& run) {
  nlohmann::json status = {{"id", run.id},
                           {"config_name", run.config_name},
                           {"state", state_name(run)},
                           {"output_dir", run.output_dir},
                           {"log_path", run.log_path},
                           {"started_at", run.started_unix},
                           {"step", 0},
                           {"max_steps", run.max_steps ? nlohmann::json(*run.max_steps) : nlohmann::json()},
                           {"eta_seconds", nullptr},
                           {"peak_bytes", nullptr},
                           {"loss", nullptr},
                           {"exit_code", run.exit_code ? nlohmann::json(*run.exit_code) : nlohmann::json()}};
  // Progress from the run's metrics.jsonl: one record per optimizer step.
  std::vector<double> step_seconds;
  int64_t peak = -1;
  try {
    const std::string text =
        util::read_regular_file(run.output_dir + "/metrics.jsonl", util::kMaxJsonFileBytes, "ui", "metrics");
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a last line without its newline is still being written
      const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
      if (!record.is_object()) continue;
      status["step"] = record.value("step", int64_t{0});
      status["loss"] = record.value("loss", 0.0);
      peak = std::max(peak, record.value("peak_bytes", int64_t{0}));
      step_seconds.push_back(record.value("step_seconds", 0.0));
    }
  } catch (const std::exception&) {
    // No metrics yet (the run is loading, caching, or failed first).
  }
  if (peak >= 0) status["peak_bytes"] = peak;
  if (run.max_steps && !step_seconds.empty() && run.running) {
    // The median of the last ten steps: the first steps (allocation, warm-up) are slower.
    std::vector<double> recent(step_seconds.end() - std::min<size_t>(10, step_seconds.size()), step_seconds.end());
    std::sort(recent.begin(), recent.end());
    const double median = recent[recent.size() / 2];
    status["eta_seconds"] = std::max<int64_t>(0, *run.max_steps - status["step"].get<int64_t>()) * median;
  }
  nlohmann::json checkpoints = nlohmann::json::array();
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> found;
  for (fs::directory_iterator it(run.output_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("checkpoint-", 0) == 0 && it->is_directory()) {
      found.emplace_back(std::atoll(name.c_str() + 11), name);
    }
  }
  std::sort(found.begin(), found.end());
  for (const auto& f : found) checkpoints.push_back(f.second);
  status["checkpoints"] = checkpoints;
  return status;
}

}  // namespace remat::ui::detail
