#include "plan_figures.h"

#include <chrono>
#include <cstring>
#include <sstream>

#include "child_process.h"
#include "profile_memory.h"
#include "remat/layout.h"
#include "remat/memory.h"
#include "remat/plan.h"
#include "remat/train/memory/admission.h"
#include "remat/train/options/safety_check.h"
#include "remat/ui/server.h"
#include "step_model_json.h"

namespace remat::ui::detail {
namespace {

// The child's answer is one line of JSON; a step model of a few hundred blocks is some 100 KiB.
constexpr size_t kMaxProfileOutputBytes = size_t{16} << 20;

const char* const kWhatToLower = "lower resolution, train_batch_size or tokenizer_max_length to get figures";

std::string limit_text(int64_t limit, int64_t option) {
  return memory::format_bytes(limit) +
         (option > 0 ? std::string(" this server allows a step profile")
                     : " a step profile may use on this server (half of the available memory, at most " +
                           memory::format_bytes(kDefaultProfileMemoryCap) + ")");
}

std::string seconds_text(double s) {
  std::ostringstream text;
  text << s;
  return text.str();
}

// The last non-empty line of the child's output, parsed (discarded when it is not JSON): a
// library may have printed something before it.
nlohmann::json last_json_line(const std::string& output) {
  const size_t end = output.find_last_not_of("\r\n");
  if (end == std::string::npos) return nlohmann::json::value_t::discarded;
  const size_t newline = output.rfind('\n', end);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  return nlohmann::json::parse(output.substr(begin, end + 1 - begin), nullptr, false);
}

}  // namespace

PlanCache::PlanCache(std::string executable, int64_t memory_limit_bytes, double timeout_s)
    : executable_(std::move(executable)), memory_limit_option_(memory_limit_bytes), timeout_s_(timeout_s) {}

void PlanCache::cancel() {
  cancelled_ = true;
  std::lock_guard<std::mutex> lock(mutex_);
  profile_finished_.notify_all();
}

train::StepModel PlanCache::profile_in_child(const PlanShape& shape, const std::string& what,
                                             const nlohmann::json& config_json, int64_t memory_limit) {
  ChildLimits limits;
  limits.resident_bytes = memory_limit;
  limits.timeout_s = timeout_s_;
  limits.max_output_bytes = kMaxProfileOutputBytes;
  const BoundedChildResult child = run_bounded_child(
      {executable_, "ui", "--profile-step"}, nlohmann::json{{"config", config_json}}.dump(), limits, &cancelled_);
  const auto limit_failure = [&](const std::string& message) {
    PlanRefusal refusal(422, {{"error", message}, {"limit_bytes", memory_limit}, {"timeout_s", timeout_s_}});
    std::lock_guard<std::mutex> lock(mutex_);
    failures_.insert_or_assign(shape.key(), Failure{memory_limit, timeout_s_, refusal});
    return refusal;
  };
  if (child.cancelled) throw PlanRefusal(503, {{"error", "[ui] the server is stopping; " + what + " was stopped"}});
  if (child.timed_out) {
    throw limit_failure("[ui] " + what + " did not finish within " + seconds_text(timeout_s_) +
                        " s, the time a step profile may take on this server; " + kWhatToLower);
  }
  if (child.memory_exceeded) {
    throw limit_failure("[ui] " + what + " needed more than the " + limit_text(memory_limit, memory_limit_option_) +
                        "; " + kWhatToLower);
  }
  const nlohmann::json answer = child.output_truncated ? nlohmann::json() : last_json_line(child.output);
  if (child.exit_code == 0 && answer.is_object() && answer.contains("step_model")) {
    try {
      return step_model_from_json(answer["step_model"]);
    } catch (const nlohmann::json::exception&) {
      throw PlanRefusal(500, {{"error", "[ui] " + what + " answered a step model the server cannot read (is " +
                                            executable_ + " the same remat as the server?)"}});
    }
  }
  // Refused an allocation below the limit: the machine itself had no more.
  if (answer.is_object() && answer.contains("out_of_memory") && answer["out_of_memory"] == true) {
    throw limit_failure("[ui] " + what + " ran out of memory: the machine had less to give than the " +
                        limit_text(memory_limit, memory_limit_option_) + "; " + kWhatToLower);
  }
  if (child.signal != 0) {
    // An allocation refused where no exception can carry it (a thread's stack, inside a library)
    // ends the child with SIGABRT or SIGSEGV; the kernel's OOM killer sends SIGKILL.
    throw limit_failure("[ui] " + what + " ended with signal " + std::to_string(child.signal) + " (" +
                        strsignal(child.signal) + ") before it finished, most likely out of memory under the " +
                        limit_text(memory_limit, memory_limit_option_) + "; " + kWhatToLower);
  }
  // remat's own messages start with "[component]"; anything else is a library's and stays out.
  const bool has_message = answer.is_object() && answer.contains("error") && answer["error"].is_string();
  const std::string message = has_message ? answer["error"].get<std::string>() : "";
  if (!message.empty() && message.front() == '[') {
    throw PlanRefusal(500, {{"error", "[ui] " + what + " failed: " + message}});
  }
  throw PlanRefusal(500, {{"error", "[ui] " + what + " failed (exit code " + std::to_string(child.exit_code) +
                                        " of `" + executable_ + " ui --profile-step`)"}});
}

std::shared_ptr<const train::StepModel> PlanCache::step_model(const PlanShape& shape, const train::TrainConfig& config,
                                                              const nlohmann::json& config_json) {
  const std::string key = shape.key();
  const std::string what = "the step profile of " + config.model_flavour + " (" + shape.description() + ")";
  const int64_t memory_limit = profile_memory_limit(memory_limit_option_);
  const auto known = [&]() -> std::shared_ptr<const train::StepModel> {
    const auto model = models_.find(key);
    if (model != models_.end()) return model->second;
    const auto failure = failures_.find(key);
    if (failure != failures_.end() && memory_limit <= failure->second.memory_limit_bytes &&
        timeout_s_ <= failure->second.timeout_s) {
      throw failure->second.refusal;
    }
    return nullptr;
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto model = known()) return model;
  }

  // Refused before it starts when even its lower bound exceeds the limit.
  if (const std::optional<ProfileDemand> demand = profile_demand_lower_bound(shape);
      demand && demand->total() > memory_limit) {
    std::string detail = memory::format_bytes(demand->weight_bytes) + " of weights";
    if (demand->attention_score_bytes > 0) {
      detail = memory::format_bytes(demand->attention_score_bytes) + " for the attention scores its " +
               std::to_string(demand->attention.count) + " attention layers keep (batch " + std::to_string(shape.batch) +
               " x " + std::to_string(demand->attention.heads) + " heads x " + std::to_string(demand->tokens) +
               "^2 tokens x 4 bytes each) and " + detail;
    }
    throw PlanRefusal(422, {{"error", "[ui] " + what + " would need at least " + memory::format_bytes(demand->total()) +
                                          ": " + detail + "; more than the " +
                                          limit_text(memory_limit, memory_limit_option_) + "; " + kWhatToLower},
                            {"estimated_bytes", demand->total()},
                            {"limit_bytes", memory_limit}});
  }

  std::unique_lock<std::mutex> lock(mutex_);
  // One profile at a time: wait for the running one (the lock is released while waiting), which
  // ends within its timeout; it may be this shape's.
  const auto waited = std::chrono::duration<double>(timeout_s_ + 5.0);
  std::shared_ptr<const train::StepModel> model;
  const bool free = profile_finished_.wait_for(lock, waited, [&] {
    if (cancelled_) return true;
    model = known();
    return model != nullptr || !profiling_;
  });
  if (model) return model;
  if (cancelled_) throw PlanRefusal(503, {{"error", "[ui] the server is stopping; no new step profiles"}});
  if (!free) {
    throw PlanRefusal(503, {{"error", "[ui] another step profile has been running for over " + seconds_text(timeout_s_) +
                                          " s; ask again when it has finished"}});
  }
  profiling_ = true;
  lock.unlock();
  // Whatever happens, the next profile may start and the waiting requests look again.
  struct Release {
    PlanCache& cache;
    ~Release() {
      std::lock_guard<std::mutex> guard(cache.mutex_);
      cache.profiling_ = false;
      cache.profile_finished_.notify_all();
    }
  } release{*this};
  model = std::make_shared<const train::StepModel>(profile_in_child(shape, what, config_json, memory_limit));
  std::lock_guard<std::mutex> guard(mutex_);
  models_[key] = model;
  return model;
}

nlohmann::json PlanCache::figures(const nlohmann::json& config_json, const train::TrainConfig& config,
                                  std::optional<int64_t> budget_bytes) {
  const PlanShape shape = plan_shape_of(config);
  nlohmann::json out;
  const std::optional<train::MemoryDemand> demand = train::predict_model_memory(shape.spec, shape.use);
  if (demand) {
    out["model_bytes"] = {{"weights", demand->weight_bytes},
                          {"gradients", demand->gradient_bytes},
                          {"optimizer", demand->optimizer_bytes},
                          {"ema", demand->ema_bytes}};
  }
  if (!demand || demand->total() > kMaxProfiledModelBytes) {
    out["basis"] = "memory model only: no step profile for " + config.model_flavour +
                   " is available on this machine (profiling it needs the model in memory). The peak "
                   "below counts weights, gradients and optimizer state, not activations; the "
                   "step-time factor and what auto picks need a profile (run `remat bench` on the "
                   "training machine)." + shape.source_note;
    out["profile_available"] = false;
    out["predicted_peak_bytes"] = demand ? nlohmann::json(demand->total()) : nlohmann::json();
    out["step_time_factor"] = nullptr;
    out["auto"] = nullptr;
    return out;
  }
  // The profile is of the model without EMA (and shared by configs that differ only there): the
  // average, where it lives on the device, is one more tensor alive through the whole step.
  auto model = std::make_shared<train::StepModel>(*step_model(shape, config, config_json));
  if (demand && demand->ema_bytes > 0) {
    model->chain.fixed_bytes += demand->ema_bytes;
    model->chain.fixed_peak_bytes += demand->ema_bytes;
  }

  // The config's own layout, over every block of the stacks.
  const CheckpointPlan plan = config.gradient_checkpointing ? config.checkpoint_plan() : CheckpointPlan::off();
  std::vector<Layout> stacks;
  for (size_t s = 0; s < model->stack_sizes.size(); ++s) stacks.push_back(plan.layout_for(s, model->stack_sizes[s]));
  const Layout keep_all = layout_keep_all(model->chain.num_blocks());
  const Prediction baseline = predict(model->chain, keep_all);
  const bool ffn = config.gradient_checkpointing && config.checkpoint_ffn_only() && model->ffn_chain;
  // CheckpointPlan::layout_for reads interval and stride only: "off" is every block kept.
  const Layout layout = (ffn || !config.gradient_checkpointing) ? keep_all : train::join_stack_layouts(stacks);
  const Prediction chosen = predict(ffn ? *model->ffn_chain : model->chain, layout);
  out["basis"] = "cost model from a profile of one training step of " + config.model_flavour + " (" +
                 shape.description() +
                 ") measured on this server's CPU; peaks count the same tensors on a GPU, times are "
                 "relative to no checkpointing." + shape.source_note;
  out["profile_available"] = true;
  out["layout"] = ffn ? "ffn (feed-forward parts checkpointed in every block)" : describe_layout(layout);
  out["interval_auto"] =
      train::interval_in_effect(config, train::checkpointing_capabilities(config.model_family)).is_auto();
  out["predicted_peak_bytes"] = chosen.peak_bytes;
  out["predicted_step_s"] = chosen.step_s;
  out["step_time_factor"] = baseline.step_s > 0 ? chosen.step_s / baseline.step_s : 1.0;
  out["no_checkpointing_peak_bytes"] = baseline.peak_bytes;

  const int64_t budget = budget_bytes ? *budget_bytes
                                      : config.gradient_checkpointing_memory_budget.value_or(
                                            train::default_memory_budget(c10::Device(c10::kCPU)));
  const PlanResult pick = plan_layout(model->chain, budget);
  out["auto"] = {{"budget_bytes", budget},
                 {"layout", describe_layout(pick.layout)},
                 {"fits", pick.fits},
                 {"predicted_peak_bytes", pick.prediction.peak_bytes},
                 {"step_time_factor", baseline.step_s > 0 ? pick.prediction.step_s / baseline.step_s : 1.0},
                 {"min_possible_peak_bytes", pick.min_possible_peak},
                 {"explanation", pick.explanation}};
  return out;
}

}  // namespace remat::ui::detail
