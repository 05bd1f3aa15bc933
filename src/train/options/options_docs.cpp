// What the options registry generates for people and tools: `remat train --help`,
// `remat options --json` and `remat options --markdown` (= docs/OPTIONS.md).
#include <algorithm>
#include <sstream>

#include <nlohmann/json.hpp>

#include "remat/train/options/options.h"
#include "remat/train/options/simpletuner.h"

namespace remat::train {
namespace {

using ordered_json = nlohmann::ordered_json;

// A value written as text (a default, a dependency's value) as the JSON value of its type.
ordered_json typed_json(OptionType type, const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  try {
    if (type == OptionType::Int) return std::stoll(text);
    if (type == OptionType::Float) return std::stod(text);
  } catch (const std::exception&) {
    // A keyword such as "auto": keep it as a string.
  }
  return text;
}

// A default for the docs: a value in backticks, or words ("unset", a note) as prose.
std::string default_text(const OptionSpec& spec) {
  if (!spec.default_note.empty()) return spec.default_note;
  return spec.default_value ? "`" + *spec.default_value + "`" : "unset";
}

std::string dependency_text(const OptionSpec& spec) {
  std::string out;
  for (size_t i = 0; i < spec.depends_on.size(); ++i) {
    out += (i ? " and `" : "`") + spec.depends_on[i].option + "` = `" + spec.depends_on[i].equals + "`";
  }
  // What a UI does otherwise (SimpleTuner's dependency actions).
  const bool enable = std::all_of(spec.depends_on.begin(), spec.depends_on.end(),
                                  [](const OptionDependency& d) { return d.action == "enable"; });
  return out + (enable ? " (otherwise shown disabled)" : " (otherwise hidden)");
}

// GitHub's heading anchor: lower case, spaces to '-', punctuation other than '-' and '_' dropped.
std::string heading_anchor(const std::string& heading) {
  std::string out;
  for (char c : heading) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (c == ' ') {
      out += '-';
    }
  }
  return out;
}

const char* const kCheckpointingIntro =
    "Checkpointed blocks keep only their inputs in the forward pass and are run again in the "
    "backward pass. How chunks, strides, backends, scopes and the auto planner work, with a "
    "worked example: [Segmented checkpointing](SEGMENTED_CHECKPOINTING.md). This section is also "
    "available in [中文](OPTIONS.zh.md), [日本語](OPTIONS.ja.md), [Español](OPTIONS.es.md), "
    "[Português (Brasil)](OPTIONS.pt-BR.md) and [हिन्दी](OPTIONS.hi.md).";

}  // namespace

std::string train_help_text() {
  std::ostringstream out;
  out << "usage: remat train [--config config.json] [--option=value | --option value | --flag] ...\n\n"
         "Trains Flux.1 or MageFlow with SimpleTuner's option names. Options come from a\n"
         "SimpleTuner-style config file (config.json, config.toml or config.env) and from flags,\n"
         "which override the file. Booleans: --flag, --flag=true, --flag=false. null or an empty\n"
         "value means the default. SimpleTuner options remat does not implement are listed in one\n"
         "warning; those that change what training computes are errors unless\n"
         "--ignore_unsupported_options. Full reference: docs/OPTIONS.md.\n\n"
         "  --config <path>\n      A config file with option values: .json, .toml or SimpleTuner's .env\n";
  for (const auto& section : option_sections()) {
    out << "\n" << section << ":\n";
    for (const auto& spec : option_specs()) {
      if (spec.section != section) continue;
      out << "  --" << spec.name << " <" << spec.signature() << ">\n      " << spec.help << "\n";
    }
  }
  return out.str();
}

namespace {

// The JSON types an option's value may be written as, besides null (which means "the default").
// Numbers may also be written as strings (remat reads every value as text), so numeric options
// accept a numeric string; "" is the default as well.
const char* const kIntText = "^(?:|[-+]?[0-9]+(?:\\.0*)?(?:[eE]\\+?[0-9]+)?)$";
const char* const kFloatText = "^(?:|[-+]?(?:[0-9]+\\.?[0-9]*|\\.[0-9]+)(?:[eE][-+]?[0-9]+)?)$";
const char* const kBoolText =
    "^(?:|[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]|[Yy][Ee][Ss]|[Nn][Oo]|[Oo][Nn]|[Oo][Ff][Ff]|1|0)$";
const char* const kBytesText = "^(?:|[0-9]+(?:\\.[0-9]+)?\\s*(?:[KkMmGgTtPpEe](?:[Ii]?[Bb])?|[Bb])?)$";

// The value schema of one option (Draft 2020-12), with `x-remat` UI metadata.
ordered_json option_definition(const OptionSpec& spec) {
  ordered_json d;
  d["description"] = spec.help;
  const auto range = [&](ordered_json& j) {
    if (spec.minimum) j[spec.exclusive_minimum ? "exclusiveMinimum" : "minimum"] = *spec.minimum;
    if (spec.maximum) j["maximum"] = *spec.maximum;
  };
  switch (spec.type) {
    case OptionType::Bool:
      d["type"] = {"boolean", "integer", "string", "null"};
      d["minimum"] = 0;
      d["maximum"] = 1;
      d["pattern"] = kBoolText;
      break;
    case OptionType::Int:
      if (!spec.keywords.empty()) {
        // integer | "auto": exactly one branch matches.
        ordered_json number = {{"type", "integer"}};
        range(number);
        ordered_json alternatives = ordered_json::array({number});
        for (const auto& k : spec.keywords) alternatives.push_back({{"const", k}});
        alternatives.push_back({{"type", "string"}, {"pattern", "^(?:|[0-9]+)$"}});
        alternatives.push_back({{"type", "null"}});
        d["oneOf"] = alternatives;
      } else {
        d["type"] = {"integer", "string", "null"};
        range(d);
        d["pattern"] = kIntText;
      }
      break;
    case OptionType::Float:
      d["type"] = {"number", "string", "null"};
      range(d);
      d["pattern"] = kFloatText;
      break;
    case OptionType::Choice: {
      d["type"] = {"string", "null"};
      ordered_json values = spec.choices;
      for (const auto& [old, current] : spec.value_aliases) values.push_back(old);
      values.push_back("");
      values.push_back(nullptr);
      d["enum"] = values;
      break;
    }
    case OptionType::String:
      d["type"] = {"string", "null"};
      if (!spec.pattern.empty()) d["pattern"] = "^(?:|" + spec.pattern + ")$";
      break;
    case OptionType::Path:
      d["type"] = {"string", "null"};
      break;
    case OptionType::Bytes:
      d["type"] = {"string", "integer", "null"};
      range(d);
      d["pattern"] = kBytesText;
      break;
  }
  d["default"] = spec.default_value ? typed_json(spec.type, *spec.default_value) : ordered_json(nullptr);
  if (!spec.deprecated.empty()) d["deprecated"] = true;

  ordered_json ui;
  ui["optionType"] = option_type_name(spec.type);
  ui["section"] = spec.section;
  ui["order"] = spec.order;
  if (!spec.tooltip.empty()) ui["tooltip"] = spec.tooltip;
  if (!spec.default_note.empty()) ui["defaultNote"] = spec.default_note;
  ui["nullable"] = spec.nullable;
  if (!spec.keywords.empty()) ui["keywords"] = spec.keywords;
  if (!spec.choice_labels.empty()) {
    ordered_json labels = ordered_json::object();
    for (const auto& c : spec.choices) {
      const auto it = spec.choice_labels.find(c);
      labels[c] = it != spec.choice_labels.end() ? it->second : c;
    }
    ui["choiceLabels"] = labels;
  }
  if (!spec.value_aliases.empty()) ui["valueAliases"] = spec.value_aliases;
  if (!spec.unsupported_values.empty()) ui["unsupportedValues"] = spec.unsupported_values;
  if (!spec.choices_depend_on.empty()) {
    ui["choicesBy"] = {{"option", spec.choices_depend_on}, {"choices", spec.choices_by_value}};
  }
  ordered_json deps = ordered_json::array();
  for (const auto& dep : spec.depends_on) {
    const OptionSpec* target = find_option(dep.option);
    deps.push_back({{"option", dep.option},
                    {"equals", typed_json(target ? target->type : OptionType::String, dep.equals)},
                    {"action", dep.action}});
  }
  ui["dependsOn"] = deps;
  if (!spec.relations.empty()) {
    ordered_json relations = ordered_json::array();
    for (const auto& r : spec.relations) relations.push_back({{"atLeast", r.option}});
    ui["relations"] = relations;
  }
  ui["checkpointing"] = spec.checkpointing;
  if (!spec.aliases.empty()) ui["aliases"] = spec.aliases;
  if (const auto env = simpletuner_env_name_of(spec.name)) ui["envName"] = *env;
  if (!spec.deprecated.empty()) ui["deprecated"] = spec.deprecated;
  ui["docs"] = spec.doc_anchor();
  d["x-remat"] = ui;
  return d;
}

}  // namespace

std::string options_json() {
  ordered_json root;
  root["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  root["$id"] = "urn:remat:train-options";
  root["title"] = "remat train options";
  root["description"] =
      "A `remat train` config file (SimpleTuner's option names). Keys may be written with a leading "
      "\"--\"; null or \"\" means the option's default. SimpleTuner options remat does not "
      "implement are accepted (the run lists them in one warning; those that change what training "
      "computes stop it unless ignore_unsupported_options is true); any other key is an error. "
      "Each definition carries remat's UI metadata under \"x-remat\".";
  root["type"] = "object";
  ordered_json properties = ordered_json::object();
  ordered_json defs = ordered_json::object();
  for (const auto& spec : option_specs()) {
    defs[spec.name] = option_definition(spec);
    const ordered_json ref = {{"$ref", "#/$defs/" + spec.name}};
    std::vector<std::string> keys{spec.name};
    keys.insert(keys.end(), spec.aliases.begin(), spec.aliases.end());
    for (const auto& k : keys) {
      properties[k] = ref;
      properties["--" + k] = ref;
    }
  }
  root["properties"] = properties;
  // SimpleTuner's other option names: any value (remat does not read it).
  std::string names;
  ordered_json simpletuner = ordered_json::object();
  for (const auto& st : simpletuner_options()) {
    if (find_option(st.name) != nullptr) continue;
    names += (names.empty() ? "" : "|") + st.name;
    ordered_json o = {{"group", st.group}, {"changesTraining", st.changes_training}};
    if (st.changes_training) {
      o["neutral"] = st.neutral;
      o["effect"] = st.effect;
    }
    simpletuner[st.name] = o;
  }
  root["patternProperties"] = {{"^(?:--)?(?:" + names + ")$",
                                {{"description", "A SimpleTuner option remat does not implement"}}}};
  root["additionalProperties"] = false;
  root["$defs"] = defs;
  ordered_json ui;
  ui["sections"] = option_sections();
  ordered_json groups = ordered_json::object();
  for (const auto& [group, title] : simpletuner_groups()) groups[group] = title;
  ui["simpletunerGroups"] = groups;
  ui["simpletunerOptions"] = simpletuner;
  root["x-remat"] = ui;
  return root.dump(2) + "\n";
}

std::string options_markdown() {
  std::ostringstream out;
  out << "# `remat train` options\n\n"
         "<!-- Generated by `remat options --markdown` from the registry in src/train/options/options.cpp.\n"
         "     Do not edit: the train_tests suite fails when this file and the registry differ. -->\n\n"
         "`remat train` uses SimpleTuner's option names, defaults and validation rules, so a SimpleTuner "
         "config runs as it is. Options come from a config file named by `--config` and from "
         "command-line flags, which override the file: `--key=value`, `--key value`, and for "
         "booleans `--flag` or `--flag=false`. The file's format follows its extension, as "
         "SimpleTuner's config.json, config.toml and config.env:\n\n"
         "- `.json`: a flat JSON object; keys may be written with or without the leading `--`.\n"
         "- `.toml`: top-level TOML keys.\n"
         "- `.env`: `export NAME=value` lines with SimpleTuner's environment names (each option's "
         "**config.env name** below, such as `TRAINING_SEED`), and `TRAINER_EXTRA_ARGS` holding "
         "further `--flags`.\n\n"
         "`null` (or an empty value) means an option's default everywhere; options that may be unset "
         "also accept `none`. Whole numbers written as floats (`16.0`) are accepted for integer "
         "options.\n\n"
         "Every key is one of three kinds. An option listed here is used. A SimpleTuner option remat "
         "does not implement (validation, tracking, hub, quantisation, ...; the list is "
         "src/train/options/simpletuner_options.inc) is ignored and named in one warning at start, grouped "
         "by what it is, except when it changes what training computes (`use_ema: true`, "
         "`tread_config`, `controlnet: true`, `lora_type: lycoris`, ...), and likewise a value of "
         "an option listed here that remat does not train (`base_model_precision: int4-quanto`, "
         "`lora_format: comfyui`): then the run stops with an error naming it, unless "
         "`--ignore_unsupported_options` is given. Any other key is "
         "an error listing all such keys at once, with a suggestion when one is a near miss.\n\n"
         "Machine-readable form for editors and web UIs: `remat options --json`, a JSON Schema "
         "(Draft 2020-12) of a config file with remat's UI metadata (help, tooltip, section, order, "
         "dependencies, choice labels, docs link) under `x-remat`.\n\n"
         "```json\n"
         "{\n"
         "  \"--model_family\": \"flux\",\n"
         "  \"model_flavour\": \"dev\",\n"
         "  \"model_type\": \"lora\",\n"
         "  \"lora_rank\": 16,\n"
         "  \"gradient_checkpointing\": true,\n"
         "  \"gradient_checkpointing_interval\": 2,\n"
         "  \"report_to\": \"none\"\n"
         "}\n"
         "```\n\n"
         "The same as `config.toml` and as `config.env`:\n\n"
         "```toml\n"
         "model_family = \"flux\"\n"
         "model_flavour = \"dev\"\n"
         "model_type = \"lora\"\n"
         "lora_rank = 16\n"
         "gradient_checkpointing = true\n"
         "gradient_checkpointing_interval = 2\n"
         "report_to = \"none\"\n"
         "```\n\n"
         "```sh\n"
         "export MODEL_FAMILY=flux\n"
         "export MODEL_TYPE=lora\n"
         "export USE_GRADIENT_CHECKPOINTING=true\n"
         "export TRAINER_EXTRA_ARGS=\"--model_flavour=dev --lora_rank=16 --gradient_checkpointing_interval=2\"\n"
         "```\n\n## Contents\n\n";
  for (const auto& section : option_sections()) {
    out << "- [" << section << "](#" << heading_anchor(section) << ")\n";
  }
  for (const auto& section : option_sections()) {
    out << "\n## " << section << "\n";
    if (section == "Gradient checkpointing") out << "\n" << kCheckpointingIntro << "\n";
    for (const auto& spec : option_specs()) {
      if (spec.section != section) continue;
      out << "\n### `--" << spec.name << "`\n\n";
      out << "- **Type**: " << option_type_name(spec.type);
      if (!spec.choices.empty()) {
        out << " (";
        for (size_t i = 0; i < spec.choices.size(); ++i) out << (i ? ", `" : "`") << spec.choices[i] << "`";
        out << ")";
      }
      // The signature carries the range and keywords after the type name; show them verbatim.
      const std::string sig = spec.signature();
      std::string type_part = sig.substr(0, sig.find(", default "));
      type_part = type_part.substr(0, type_part.find(" | "));
      if (!spec.pattern.empty()) {
        out << " (" << spec.pattern_description << ")";
      } else if (spec.type != OptionType::Choice && type_part != option_type_name(spec.type)) {
        out << " (" << type_part.substr(option_type_name(spec.type).size() + 1) << ")";
      }
      for (const auto& k : spec.keywords) out << " or `" << k << "`";
      out << "\n- **Default**: " << default_text(spec) << "\n";
      out << "- **What**: " << spec.help << "\n";
      if (!spec.tooltip.empty()) out << "- **Note**: " << spec.tooltip << "\n";
      if (!spec.choice_labels.empty()) {
        out << "- **Choices**:";
        for (const auto& c : spec.choices) {
          const auto it = spec.choice_labels.find(c);
          if (it != spec.choice_labels.end()) out << "\n  - `" << c << "`: " << it->second;
        }
        out << "\n";
      }
      for (const auto& [value, needs] : spec.unsupported_values) {
        out << "- **Not supported yet**: `" << value << "` (needs " << needs
            << "; an error unless `--ignore_unsupported_options`)\n";
      }
      if (!spec.value_aliases.empty()) {
        out << "- **Also accepted**: ";
        bool first = true;
        for (const auto& [old, current] : spec.value_aliases) {
          out << (first ? "" : ", ") << "`" << old << "` (= `" << current << "`)";
          first = false;
        }
        out << "\n";
      }
      if (!spec.depends_on.empty()) out << "- **Takes effect when**: " << dependency_text(spec) << "\n";
      for (const auto& [on, choices] : spec.choices_by_value) {
        out << "- **With `" << spec.choices_depend_on << "` = `" << on << "`**: ";
        for (size_t i = 0; i < choices.size(); ++i) out << (i ? ", `" : "`") << choices[i] << "`";
        out << "\n";
      }
      for (const auto& r : spec.relations) out << "- **At least**: `" << r.option << "` (when both are set)\n";
      if (!spec.deprecated.empty()) out << "- **Deprecated**: " << spec.deprecated << "\n";
      if (!spec.aliases.empty()) {
        out << "- **Also accepted as**: ";
        for (size_t i = 0; i < spec.aliases.size(); ++i) out << (i ? ", `" : "`") << spec.aliases[i] << "`";
        out << "\n";
      }
      if (const auto env = simpletuner_env_name_of(spec.name)) out << "- **config.env name**: `" << *env << "`\n";
    }
  }
  return out.str();
}

}  // namespace remat::train
