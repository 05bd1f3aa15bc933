#pragma once
// POST /api/plan's figures: the planner's predictions for a config's checkpoint layout, from a
// step model measured once per model shape on this machine's CPU (remat/train/auto_layout.h).

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "remat/train/auto_layout.h"
#include "remat/train/config.h"

namespace remat::ui::detail {

/// Step models by model shape (family, flavour, model config, LoRA, batch, tokens, precision):
/// the first request for a shape profiles it (seconds for the tiny flavours), later ones reuse it.
class PlanCache {
 public:
  /// The figures for `config` (validated); `budget_bytes` overrides the config's budget.
  nlohmann::json figures(const train::TrainConfig& config, std::optional<int64_t> budget_bytes);

 private:
  std::mutex mutex_;  // one profile at a time: the 2 figures would disturb each other's timing
  std::map<std::string, std::shared_ptr<const train::StepModel>> models_;
};

/// Models whose weights, gradients and optimizer state exceed this are not profiled on the
/// server's CPU: the answer then gives the memory model's figures and says so.
inline constexpr int64_t kMaxProfiledModelBytes = int64_t{1} << 30;

}  // namespace remat::ui::detail
