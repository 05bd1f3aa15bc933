#pragma once
// POST /api/plan's figures: the planner's predictions for a config's checkpoint layout, from a
// step model measured once per model shape on this machine's CPU (remat/train/memory/auto_layout.h).
// The measuring runs in a child process of the remat binary (`remat ui --profile-step`,
// remat/ui/step_profile.h) under a memory limit and a timeout, so that a profile too large for
// the machine can neither take the server's memory nor keep other requests waiting.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "plan_shape.h"
#include "remat/train/memory/auto_layout.h"
#include "remat/train/options/config.h"

namespace remat::ui::detail {

/// Why /api/plan gives no figures: the HTTP status and the answer, {"error": "[ui] ...", ...}.
struct PlanRefusal : std::runtime_error {
  PlanRefusal(int status, nlohmann::json body)
      : std::runtime_error(body.value("error", "")), status(status), body(std::move(body)) {}
  int status;
  nlohmann::json body;
};

/// Step models by model shape (PlanShape::key): the first request for a shape profiles it in a
/// child process (seconds for the tiny flavours), later ones reuse it. Profiles run one at a
/// time (two would disturb each other's timings, and one limit then bounds their memory); a
/// request for another shape waits for the running one without holding any lock, and every
/// request whose shape is known is answered at once.
class PlanCache {
 public:
  /// `executable`: the remat binary the profiles run; the limits: ServerOptions::plan_memory_limit_bytes
  /// (0: profile_memory_limit's default) and ServerOptions::plan_timeout_s.
  PlanCache(std::string executable, int64_t memory_limit_bytes, double timeout_s);

  /// The figures for `config`, validated from `config_json` (the child validates it again);
  /// `budget_bytes` overrides the config's budget. Throws PlanRefusal: 422 for a profile
  /// predicted to exceed the memory limit, or that exceeded it or the timeout (each naming the
  /// limit and what to lower); 503 while stopping or when the running profile does not finish.
  nlohmann::json figures(const nlohmann::json& config_json, const train::TrainConfig& config,
                         std::optional<int64_t> budget_bytes);

  /// Kills the profile still running and refuses later ones: the server is stopping.
  void cancel();

 private:
  // A profile that failed for a limit, kept so that asking again does not run it again under
  // the same (or a lower) limit.
  struct Failure {
    int64_t memory_limit_bytes;
    double timeout_s;
    PlanRefusal refusal;
  };

  std::shared_ptr<const train::StepModel> step_model(const PlanShape& shape, const train::TrainConfig& config,
                                                     const nlohmann::json& config_json);
  // Runs the child; returns the model or throws PlanRefusal (a Failure when a limit ended it).
  train::StepModel profile_in_child(const PlanShape& shape, const std::string& what,
                                    const nlohmann::json& config_json, int64_t memory_limit);

  const std::string executable_;
  const int64_t memory_limit_option_;
  const double timeout_s_;
  std::mutex mutex_;  // guards the maps and profiling_; never held while a profile runs
  std::condition_variable profile_finished_;
  bool profiling_ = false;
  std::atomic<bool> cancelled_{false};
  std::map<std::string, std::shared_ptr<const train::StepModel>> models_;
  std::map<std::string, Failure> failures_;
};

/// Models whose weights, gradients and optimizer state exceed this are not profiled on the
/// server's CPU: the answer then gives the memory model's figures and says so.
inline constexpr int64_t kMaxProfiledModelBytes = int64_t{1} << 30;

}  // namespace remat::ui::detail
