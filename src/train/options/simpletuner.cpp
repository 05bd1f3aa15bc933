// SimpleTuner's option names: the data of simpletuner_options.inc as tables.
#include "string_helpers.h"
#include "remat/train/options/simpletuner.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace remat::train {
namespace {

using remat::detail::lower;


std::vector<SimpleTunerOption> build_options() {
  std::vector<SimpleTunerOption> rows;
#define REMAT_ST_OPTION(name, group) rows.push_back({#name, #group, false, "", ""});
#define REMAT_ST_CHANGES(name, group, neutral, effect) rows.push_back({#name, #group, true, neutral, effect});
#define REMAT_ST_ENV(env, option, value)
#include "options/simpletuner_options.inc"
#undef REMAT_ST_OPTION
#undef REMAT_ST_CHANGES
#undef REMAT_ST_ENV
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return rows;
}

std::vector<SimpleTunerEnvName> build_env_names() {
  std::vector<SimpleTunerEnvName> rows;
#define REMAT_ST_OPTION(name, group)
#define REMAT_ST_CHANGES(name, group, neutral, effect)
#define REMAT_ST_ENV(env, option, value) rows.push_back({#env, #option, value});
#include "options/simpletuner_options.inc"
#undef REMAT_ST_OPTION
#undef REMAT_ST_CHANGES
#undef REMAT_ST_ENV
  return rows;
}

// A number written as text, when the whole text is one.
std::optional<double> number_of(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return v;
}

}  // namespace

bool SimpleTunerOption::is_neutral(const std::optional<std::string>& value) const {
  if (!value) return true;
  const std::string v = lower(*value);
  if (v.empty() || v == "none" || v == "null") return true;
  if (neutral.empty()) return false;
  if (v == lower(neutral)) return true;
  if (neutral == "false") return v == "0" || v == "no" || v == "off";
  const auto a = number_of(v), b = number_of(neutral);
  return a && b && *a == *b;
}

const std::vector<SimpleTunerOption>& simpletuner_options() {
  static const std::vector<SimpleTunerOption> rows = build_options();
  return rows;
}

const SimpleTunerOption* find_simpletuner_option(std::string_view name) {
  while (!name.empty() && name.front() == '-') name.remove_prefix(1);
  const auto& rows = simpletuner_options();
  const auto it = std::lower_bound(rows.begin(), rows.end(), name,
                                   [](const SimpleTunerOption& o, std::string_view n) { return o.name < n; });
  return it != rows.end() && it->name == name ? &*it : nullptr;
}

const std::vector<std::pair<std::string, std::string>>& simpletuner_groups() {
  // The order people scan a warning in: what they most likely set on purpose first.
  static const std::vector<std::pair<std::string, std::string>> groups = {
      {"quantisation", "quantisation"},
      {"lora", "LoRA variants and adapters"},
      {"loss", "extra losses and noise"},
      {"timesteps", "timestep sampling"},
      {"conditioning", "ControlNet and conditioning"},
      {"routing", "block routing"},
      {"distillation", "distillation"},
      {"training", "training length"},
      {"optimizer", "optimizer and learning-rate extras (adam_* apply only to SimpleTuner's DeepSpeed path)"},
      {"data", "datasets, buckets and captions"},
      {"caching", "caches"},
      {"encoders", "text encoders and VAE (remat trains on cached latents and embeddings)"},
      {"model_loading", "model loading"},
      {"validation", "validation and evaluation"},
      {"tracking", "tracking and logging"},
      {"publishing", "Hub publishing"},
      {"checkpoints", "checkpoint housekeeping"},
      {"offload", "memory offload and block swapping"},
      {"kernels", "compilation and attention kernels"},
      {"distributed", "multi-process and multi-machine launch"},
      {"runtime", "runtime"},
      {"other_families", "options of other model families"},
      {"webui", "web UI fields"},
  };
  return groups;
}

const std::vector<SimpleTunerEnvName>& simpletuner_env_names() {
  static const std::vector<SimpleTunerEnvName> rows = build_env_names();
  return rows;
}

const SimpleTunerEnvName* find_simpletuner_env_name(std::string_view env) {
  for (const auto& e : simpletuner_env_names()) {
    if (e.env == env) return &e;
  }
  return nullptr;
}

std::optional<std::string> simpletuner_env_name_of(std::string_view option) {
  for (const auto& e : simpletuner_env_names()) {
    if (e.option == option && e.value.empty()) return e.env;
  }
  return std::nullopt;
}

}  // namespace remat::train
