// What the options registry generates for people and tools: `remat train --help`,
// `remat options --json` and `remat options --markdown` (= docs/OPTIONS.md).
#include <sstream>

#include <nlohmann/json.hpp>

#include "remat/train/options.h"

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

const char* schema_type(OptionType type) {
  switch (type) {
    case OptionType::Bool: return "boolean";
    case OptionType::Int: return "integer";
    case OptionType::Float: return "number";
    default: return "string";
  }
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
  return out;
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
         "SimpleTuner-style config.json (keys with or without \"--\") and from flags, which\n"
         "override the file. Booleans: --flag, --flag=true, --flag=false. Options that may be\n"
         "unset accept an empty value or none. Full reference: docs/OPTIONS.md.\n\n"
         "  --config <path>\n      A config.json with option values\n";
  for (const auto& section : option_sections()) {
    out << "\n" << section << ":\n";
    for (const auto& spec : option_specs()) {
      if (spec.section != section) continue;
      out << "  --" << spec.name << " <" << spec.signature() << ">\n      " << spec.help << "\n";
    }
  }
  return out.str();
}

std::string options_json() {
  ordered_json root;
  root["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  root["title"] = "remat train options";
  root["description"] =
      "Options of `remat train` (SimpleTuner names). Each property also carries remat's own "
      "type (optionType), section, tooltip, dependsOn and docs anchor for editors and web UIs.";
  root["type"] = "object";
  root["additionalProperties"] = false;
  root["sections"] = option_sections();
  ordered_json properties = ordered_json::object();
  for (const auto& spec : option_specs()) {
    ordered_json p;
    p["type"] = schema_type(spec.type);
    p["optionType"] = option_type_name(spec.type);
    if (spec.type == OptionType::Bytes) p["format"] = "bytes";
    p["description"] = spec.help;
    if (!spec.tooltip.empty()) p["tooltip"] = spec.tooltip;
    p["default"] = spec.default_value ? typed_json(spec.type, *spec.default_value) : ordered_json(nullptr);
    if (!spec.default_note.empty()) p["defaultNote"] = spec.default_note;
    if (spec.minimum) p[spec.exclusive_minimum ? "exclusiveMinimum" : "minimum"] = *spec.minimum;
    if (spec.maximum) p["maximum"] = *spec.maximum;
    if (!spec.choices.empty()) p["enum"] = spec.choices;
    if (!spec.keywords.empty()) p["keywords"] = spec.keywords;
    p["nullable"] = spec.nullable;
    ordered_json deps = ordered_json::array();
    for (const auto& d : spec.depends_on) {
      const OptionSpec* target = find_option(d.option);
      deps.push_back({{"option", d.option},
                      {"equals", typed_json(target ? target->type : OptionType::String, d.equals)}});
    }
    p["dependsOn"] = deps;
    p["section"] = spec.section;
    p["checkpointing"] = spec.checkpointing;
    if (!spec.aliases.empty()) p["aliases"] = spec.aliases;
    if (!spec.choices_depend_on.empty()) {
      p["choicesBy"] = {{"option", spec.choices_depend_on}, {"choices", spec.choices_by_value}};
    }
    if (!spec.pattern.empty()) p["pattern"] = "^(" + spec.pattern + ")$";
    if (!spec.relations.empty()) {
      ordered_json relations = ordered_json::array();
      for (const auto& r : spec.relations) relations.push_back({{"atLeast", r.option}});
      p["relations"] = relations;
    }
    if (!spec.deprecated.empty()) p["deprecated"] = spec.deprecated;
    p["docs"] = spec.doc_anchor();
    properties[spec.name] = p;
  }
  root["properties"] = properties;
  return root.dump(2) + "\n";
}

std::string options_markdown() {
  std::ostringstream out;
  out << "# `remat train` options\n\n"
         "<!-- Generated by `remat options --markdown` from the registry in src/train/options.cpp.\n"
         "     Do not edit: the train_tests suite fails when this file and the registry differ. -->\n\n"
         "`remat train` uses SimpleTuner's option names, defaults and validation rules. Options come "
         "from a config.json named by `--config` (a flat JSON object; keys may be written with or "
         "without the leading `--`, as in SimpleTuner) and from command-line flags, which override "
         "the file: `--key=value`, `--key value`, and for booleans `--flag` or `--flag=false`. An "
         "unknown key is an error that names the closest known option. Options that may be unset "
         "accept JSON `null`, an empty value or `none`.\n\n"
         "Machine-readable form for editors and web UIs: `remat options --json`.\n\n"
         "```json\n"
         "{\n"
         "  \"--model_family\": \"flux\",\n"
         "  \"model_type\": \"lora\",\n"
         "  \"lora_rank\": 16,\n"
         "  \"gradient_checkpointing\": true,\n"
         "  \"gradient_checkpointing_interval\": 2\n"
         "}\n"
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
    }
  }
  return out.str();
}

}  // namespace remat::train
