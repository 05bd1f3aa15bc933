// Validation of `remat train` options: every problem at once, each naming its option. The rules
// come from the registry's metadata (types, ranges, choices per family, patterns, relations,
// depends_on, deprecations) and from the families (remat/train/family/family.h); the checkpointing
// safety check (safety_check.cpp) adds SimpleTuner's rules for the checkpointing options.
#include <algorithm>
#include <cctype>
#include <set>

#include <c10/util/Exception.h>

#include "string_helpers.h"
#include "remat/util/bounded_json.h"
#include "remat/train/memory/base_precision.h"
#include "remat/train/options/config.h"
#include "remat/train/family/family.h"
#include "remat/train/options/options.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/options/safety_check.h"
#include "remat/train/options/simpletuner.h"
#include "remat/train/optimizers/zero_optimizer.h"

namespace remat::train {
namespace {

using remat::detail::join;

using Severity = Diagnostic::Severity;


// The dependency `dep` of an option holds for `config`.
bool holds(const TrainConfig& config, const OptionDependency& dep) {
  const OptionSpec* spec = find_option(dep.option);
  return spec != nullptr && spec->render(config).value_or("") == dep.equals;
}

}  // namespace

std::string unknown_option_message(std::string_view name, const std::string& where) {
  // A key from a file may be megabytes long: the message quotes its head, and the edit distance
  // (quadratic) only compares a head no option name is longer than.
  const std::string_view head = name.substr(0, 200);
  const auto suggestion = suggest_option(head);
  return "[train] unknown option '" + util::text_excerpt(name) + "'" + where +
         (suggestion ? " (did you mean '" + *suggestion + "'?)" : std::string());
}

std::vector<Diagnostic> dependency_diagnostics(TrainConfig& config, bool checkpointing) {
  std::vector<Diagnostic> out;
  for (const OptionSpec& spec : option_specs()) {
    if (spec.checkpointing != checkpointing || spec.depends_on.empty() || !spec.warns_when_unused) continue;
    const std::optional<std::string> value = spec.render(config);
    if (value == spec.default_value) continue;
    for (const auto& dep : spec.depends_on) {
      if (holds(config, dep)) continue;
      const OptionSpec* on = find_option(dep.option);
      const std::string shown = value.value_or("unset");
      Diagnostic d{Severity::Warning, spec.name, shown, ""};
      if (on != nullptr && on->type == OptionType::Bool) {
        d.message = "[train] " + spec.name + "=" + shown + " has no effect because " + dep.option +
                    " is " + on->render(config).value_or("unset");
      } else {
        d.message = "[train] " + spec.name + "=" + shown + " is only used with " + dep.option + "=" +
                    dep.equals + "; ignoring it";
        spec.assign(config, parse_option_value(spec, spec.default_value));
      }
      out.push_back(std::move(d));
      break;  // one reason is enough
    }
  }
  return out;
}

std::vector<Diagnostic> relation_diagnostics(const TrainConfig& config, const std::string& name) {
  std::vector<Diagnostic> out;
  const OptionSpec* spec = find_option(name);
  if (spec == nullptr) return out;
  for (const auto& relation : spec->relations) {
    const OptionSpec* other = find_option(relation.option);
    const auto mine = spec->render(config);
    const auto theirs = other ? other->render(config) : std::nullopt;
    if (!mine || !theirs) continue;
    char* end = nullptr;
    const double a = std::strtod(mine->c_str(), &end);
    if (*end != '\0') continue;
    const double b = std::strtod(theirs->c_str(), &end);
    if (*end != '\0') continue;  // a keyword ("auto"): nothing to compare
    if (relation.kind == OptionRelation::Kind::AtLeast && a < b) {
      out.push_back({Severity::Error, spec->name, *mine,
                     "[train] " + spec->name + " must be >= " + other->name + " (" + *theirs +
                         "), got " + *mine});
    }
  }
  return out;
}

bool ValidationReport::ok() const {
  return std::none_of(diagnostics.begin(), diagnostics.end(),
                      [](const Diagnostic& d) { return d.severity == Severity::Error; });
}

std::vector<Diagnostic> ValidationReport::errors() const {
  std::vector<Diagnostic> out;
  for (const auto& d : diagnostics) {
    if (d.severity == Severity::Error) out.push_back(d);
  }
  return out;
}

std::vector<std::string> ValidationReport::warnings() const {
  std::vector<std::string> out;
  for (const auto& d : diagnostics) {
    if (d.severity == Severity::Warning) out.push_back(d.message);
  }
  return out;
}

namespace {

// A value remat would have to train differently for: a SimpleTuner option it does not implement
// set to a non-neutral value, or a remat option's value whose training it lacks.
struct Unsupported {
  std::string option, value, why;
};

// "[train] 30 SimpleTuner options remat does not implement are ignored:" and one line per group.
std::string grouped_warning(const std::vector<std::pair<const SimpleTunerOption*, std::string>>& ignored,
                            const std::vector<Unsupported>& overridden) {
  std::string out = "[train] " + std::to_string(ignored.size() + overridden.size()) + " SimpleTuner option" +
                    (ignored.size() + overridden.size() == 1 ? " that remat does not implement is" :
                                                               "s that remat does not implement are") +
                    " ignored:";
  for (const auto& [group, title] : simpletuner_groups()) {
    std::string names;
    for (const auto& [option, shown] : ignored) {
      if (option->group == group) names += (names.empty() ? "" : ", ") + shown;
    }
    if (!names.empty()) out += "\n    " + title + ": " + names;
  }
  if (!overridden.empty()) {
    out += "\n    changing what training computes, ignored because of --ignore_unsupported_options: ";
    for (size_t i = 0; i < overridden.size(); ++i) {
      out += (i ? "; " : "") + overridden[i].option + "=" + overridden[i].value + " (" + overridden[i].why + ")";
    }
  }
  return out;
}

bool truthy(const std::optional<std::string>& text) {
  if (!text) return false;
  const std::string l = remat::detail::lower(*text);
  return l == "true" || l == "1" || l == "yes" || l == "on";
}

}  // namespace

ValidationReport validate_option_values(const OptionValues& values, const Environment& env, bool safety) {
  ValidationReport report;
  TrainConfig& config = report.config;
  auto& out = report.diagnostics;
  const auto error = [&](const std::string& option, const std::string& value, const std::string& message) {
    out.push_back({Severity::Error, option, value, message});
  };
  const auto warn = [&](const std::string& option, const std::string& value, const std::string& message) {
    out.push_back({Severity::Warning, option, value, message});
  };

  // 1. Every key classified: remat's option (typed, range, choices, pattern), a SimpleTuner
  //    option remat does not implement, or unknown to both.
  std::set<std::string> refused;
  std::vector<std::string> given, unknown;
  std::vector<std::pair<const SimpleTunerOption*, std::string>> ignored;  // option, as shown
  std::vector<Unsupported> unsupported;
  const auto ignore_it = values.find("ignore_unsupported_options");
  const bool ignore_unsupported = ignore_it != values.end() && truthy(ignore_it->second);
  for (const auto& [key, text] : values) {
    const OptionSpec* spec = find_option(key);
    if (spec == nullptr) {
      const SimpleTunerOption* st = find_simpletuner_option(key);
      if (st == nullptr) {
        unknown.push_back(key);
      } else if (st->changes_training && !st->is_neutral(text)) {
        unsupported.push_back({st->name, text.value_or("null"), st->effect});
      } else {
        ignored.emplace_back(st, st->name);
      }
      continue;
    }
    given.push_back(spec->name);
    if (!spec->deprecated.empty()) {
      warn(spec->name, text.value_or(""), "[train] " + spec->name + " is deprecated: " + spec->deprecated);
    }
    try {
      const OptionValue value = parse_option_value(*spec, text);
      spec->assign(config, value);
      if (const auto* v = std::get_if<std::string>(&value)) {
        const auto needs = spec->unsupported_values.find(*v);
        if (needs != spec->unsupported_values.end()) {
          unsupported.push_back({spec->name, *v, "needs " + needs->second + ", which remat does not have"});
        } else if (spec->unavailable_value) {
          if (const auto lacks = spec->unavailable_value(*v)) unsupported.push_back({spec->name, *v, "needs " + *lacks});
        }
      }
    } catch (const ValidationError& e) {
      error(e.option(), e.value(), e.message());
      refused.insert(spec->name);
    }
  }
  if (!unknown.empty()) {
    std::string list;
    for (const auto& key : unknown) {
      // A key from a file may be megabytes long: quote its head, and compare only a head no
      // option name is longer than (the edit distance is quadratic).
      const auto suggestion = suggest_option(std::string_view(key).substr(0, 200));
      list += (list.empty() ? "'" : ", '") + util::text_excerpt(key) + "'" +
              (suggestion ? " (did you mean '" + *suggestion + "'?)" : std::string());
    }
    error(util::text_excerpt(unknown.front()), "",
          std::string("[train] unknown option") + (unknown.size() > 1 ? "s " : " ") + list +
              ": neither remat's nor SimpleTuner's (remat train --help lists remat's)");
  }
  std::vector<Unsupported> overridden;
  for (const auto& u : unsupported) {
    if (!ignore_unsupported) {
      error(u.option, u.value,
            "[train] " + u.option + "=" + u.value + " is not supported by remat yet: it " + u.why +
                ", so remat would train something else than the config asks for. Remove it, or pass "
                "--ignore_unsupported_options to train without it");
      continue;
    }
    overridden.push_back(u);
    // A remat option's unsupported value falls back to the default (flux_lora_target controlnet).
    const OptionSpec* spec = find_option(u.option);
    if (spec != nullptr && spec->name != "model_flavour") spec->assign(config, parse_option_value(*spec, spec->default_value));
  }
  if (!ignored.empty() || !overridden.empty()) warn("", "", grouped_warning(ignored, overridden));

  // 2. The family: its default flavour, and choices that depend on it (model_flavour).
  const ModelFamily* family = refused.count("model_family") ? nullptr : find_model_family(config.model_family);
  if (family != nullptr && config.model_flavour.empty()) config.model_flavour = family->default_flavour;
  for (const OptionSpec& spec : option_specs()) {
    if (spec.choices_depend_on.empty() || refused.count(spec.name) || refused.count(spec.choices_depend_on)) {
      continue;
    }
    const auto value = spec.render(config);
    const OptionSpec* on = find_option(spec.choices_depend_on);
    const std::string on_value = on ? on->render(config).value_or("") : "";
    const auto allowed = spec.choices_by_value.find(on_value);
    if (!value || allowed == spec.choices_by_value.end()) continue;
    if (std::find(allowed->second.begin(), allowed->second.end(), *value) == allowed->second.end()) {
      error(spec.name, *value,
            "[train] " + spec.name + " must be one of " + join(allowed->second) + " for " +
                spec.choices_depend_on + " " + on_value + ", got '" + *value + "'");
      refused.insert(spec.name);
    }
  }
  if (family != nullptr && !refused.count("model_flavour") && family->apply_flavour) {
    for (const auto& w : family->apply_flavour(config, given)) warn("model_flavour", config.model_flavour, w);
  }

  // A quantised base is for LoRA only: an error, not the dependency rule's warning (a full
  // fine-tune at no_change would silently be a different run from the one asked for).
  for (auto& d : base_model_precision_diagnostics(config)) {
    out.push_back(std::move(d));
    config.base_model_precision = "no_change";  // reported once, not again as a dependency
  }
  // Block swap streams a LoRA run's frozen base, or a full fine-tune's trained weights both ways
  // (SimpleTuner's MusubiBlockSwapManager moves trainable blocks too).
  if (config.musubi_blocks_to_swap > 0 && !refused.count("musubi_blocks_to_swap")) {
    const std::string value = std::to_string(config.musubi_blocks_to_swap);
    if (family != nullptr && !family->checkpointing.block_swap) {
      error("musubi_blocks_to_swap", value,
            "[train] musubi_blocks_to_swap is not supported for model_family " + config.model_family +
                ", got " + value + "; use 0");
    } else if (config.model_type != "lora" && config.deepspeed_config) {
      error("musubi_blocks_to_swap", value,
            "[train] musubi_blocks_to_swap=" + value + " with model_type=" + config.model_type +
                " keeps the streamed blocks' weights, gradients and optimizer state in host memory, which "
                "ZeRO's sharded optimizer (deepspeed_config) does not know; use one of the two");
    } else if (config.model_type != "lora" && config.use_ema && config.ema_device == "accelerator" &&
               !config.ema_cpu_only) {
      error("musubi_blocks_to_swap", value,
            "[train] musubi_blocks_to_swap=" + value + " with model_type=" + config.model_type +
                " keeps the streamed blocks' trained weights in host memory, and ema_device=accelerator "
                "would average them on the device; use ema_device=cpu with it, or musubi_blocks_to_swap=0");
    }
  }

  // SimpleTuner's safety check refuses attention offload for families without a clean
  // attention/FFN boundary (default_settings/safety_check.py).
  if (config.gradient_checkpointing_offload_attention && family != nullptr &&
      !family->checkpointing.attention_offload && !refused.count("gradient_checkpointing_offload_attention")) {
    error("gradient_checkpointing_offload_attention", "true",
          "[train] gradient_checkpointing_offload_attention is not supported for model_family " +
              config.model_family + " (it needs a clean attention/FFN boundary in every block); use false");
  }

  // ZeRO stage 1 (deepspeed_config): an error with a LoRA, likewise, not the dependency warning.
  if (config.deepspeed_config && !refused.count("deepspeed_config")) {
    try {
      std::vector<std::string> zero_warnings;
      config.zero_stage = zero_stage_of(*config.deepspeed_config, &zero_warnings);
      for (const auto& w : zero_warnings) warn("deepspeed_config", *config.deepspeed_config, w);
      check_zero_run(config.zero_stage, config.model_type, config.optimizer);
    } catch (const ValidationError& e) {
      error(e.option(), util::text_excerpt(*config.deepspeed_config), e.message());
      config.zero_stage = 0;
      config.deepspeed_config.reset();  // reported once, not again as a dependency
    }
  }

  // SimpleTuner's cmd_args.py: ema_cpu_only keeps the EMA weights on the host.
  if (config.use_ema && config.ema_cpu_only) config.ema_device = "cpu";

  // 3. Dependencies and relations of the options outside the checkpointing group (the safety
  //    check, below, covers that group with SimpleTuner's rules).
  for (auto& d : dependency_diagnostics(config, /*checkpointing=*/false)) out.push_back(std::move(d));
  for (const OptionSpec& spec : option_specs()) {
    if (spec.checkpointing || refused.count(spec.name)) continue;
    for (auto& d : relation_diagnostics(config, spec.name)) out.push_back(std::move(d));
  }

  // 4. Rules between options, and what the environment decides.
  if (config.max_train_steps == 0 && config.num_train_epochs == 0) {
    error("num_train_epochs", "0",
          "[train] max_train_steps or num_train_epochs must be above 0 (num_train_epochs 0 means \"use "
          "max_train_steps\"), got both 0");
  }
  if (!config.lora_alpha) config.lora_alpha = static_cast<double>(config.lora_rank);
  if (config.device == "auto") {
    config.device = env.cuda_available ? "cuda" : "cpu";
  } else if (config.device.rfind("cuda", 0) == 0) {
    if (!env.cuda_available) {
      error("device", config.device,
            "[train] device must be cpu or auto on this machine (CUDA is not available), got '" +
                config.device + "'");
    } else if (config.device.size() > 5) {
      const int64_t index = std::stoll(config.device.substr(5));  // the pattern made it digits
      if (index >= env.cuda_devices) {
        error("device", config.device,
              "[train] device must be cuda:0 to cuda:" + std::to_string(env.cuda_devices - 1) +
                  " on this machine, got '" + config.device + "'");
      }
    }
  }
  // Random weights only when asked for: unset with one of remat's small flavours (which have no
  // published weights), or "random". A published flavour without a path means its hub id
  // (resolve_hub_models).
  if (family != nullptr && !config.pretrained_transformer_model_name_or_path) {
    const FlavourSpec* flavour = family->flavour(config.model_flavour);
    if (config.pretrained_model_name_or_path == std::optional<std::string>(kRandomWeights)) {
      warn("pretrained_model_name_or_path", kRandomWeights,
           "[train] pretrained_model_name_or_path is random: the " + config.model_flavour +
               " transformer starts from random weights");
    } else if (!config.pretrained_model_name_or_path && flavour != nullptr && flavour->hub_id.empty()) {
      warn("pretrained_model_name_or_path", "",
           "[train] pretrained_model_name_or_path is not set: the " + config.model_flavour +
               " transformer (remat's small configuration) starts from random weights");
    }
  }
  // The learning-rate schedule as SimpleTuner builds it (cli_utils.normalize_lr_scheduler_value
  // and custom_schedule.get_lr_scheduler).
  // constant with a warmup is constant_with_warmup (SimpleTuner does it silently; so does remat,
  // the option's note says so).
  if (config.lr_scheduler == "constant" && config.lr_warmup_steps > 0) config.lr_scheduler = "constant_with_warmup";
  if ((config.lr_scheduler == "sine" || config.lr_scheduler == "cosine_with_restarts") &&
      config.lr_warmup_steps == 0) {
    error("lr_warmup_steps", "0",
          "[train] lr_warmup_steps must be >= 1 with lr_scheduler " + config.lr_scheduler +
              " (SimpleTuner uses it as the period), got 0");
  }
  if (config.lr_scheduler == "cosine" && config.lr_warmup_steps == 0) {
    warn("lr_warmup_steps", "0",
         "[train] lr_scheduler cosine uses lr_warmup_steps as its half-period; with 0 it is 1000 steps "
         "(as in SimpleTuner)");
  }
  if (config.lr_scheduler == "cosine_with_restarts") {
    warn("lr_scheduler", "cosine_with_restarts",
         "[train] lr_scheduler cosine_with_restarts keeps the learning rate at learning_rate, as "
         "SimpleTuner's implementation does (it warns that it misbehaves and recommends sine)");
  }
  if (config.lr_scheduler == "polynomial" && !(config.learning_rate > config.lr_end)) {
    error("lr_end", std::to_string(config.lr_end),
          "[train] lr_end must be below learning_rate (" + std::to_string(config.learning_rate) +
              ") with lr_scheduler polynomial, got " + std::to_string(config.lr_end));
  }
  if (!refused.count("optimizer") && !refused.count("optimizer_config")) {
    try {
      std::vector<std::string> optimizer_warnings;
      optimizer_settings(config, &optimizer_warnings);
      for (const auto& w : optimizer_warnings) warn("optimizer_config", config.optimizer_config, w);
    } catch (const ValidationError& e) {
      error(e.option(), e.value(), e.message());
    } catch (const c10::Error& e) {
      error("optimizer", config.optimizer, e.what_without_backtrace());
    }
  }

  // 5. The checkpointing safety check (SimpleTuner's rules, per family).
  if (safety && family != nullptr) {
    try {
      for (auto& d : safety_check_diagnostics(config)) out.push_back(std::move(d));
    } catch (const ValidationErrors& e) {
      for (const auto& d : e.errors()) out.push_back(d);
    } catch (const ValidationError& e) {
      error(e.option(), e.value(), e.message());
    }
  }
  return report;
}

}  // namespace remat::train
