#pragma once
/// \file
/// The options registry of `remat train`: ONE table that defines every option once (name, type,
/// default, help, tooltip, validation, dependencies, docs anchor, section, and whether it belongs
/// to gradient checkpointing). The `--help` text, config validation, `remat options --json`
/// (for a web UI or an editor) and docs/OPTIONS.md are all generated from it.
///
/// Names, defaults and semantics follow SimpleTuner, so its users feel at home.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "remat/export.h"
#include "remat/train/options/config.h"

namespace remat::train {

/// How an option's value is written and checked.
enum class OptionType {
  Bool,    ///< true/false (also 1/0, yes/no, on/off); `--flag` alone means true
  Int,     ///< a whole number
  Float,   ///< a finite number
  String,  ///< free text
  Choice,  ///< one of OptionSpec::choices
  Path,    ///< a non-empty file-system path
  Bytes,   ///< a byte size such as "20GiB" (see parse_bytes)
};

/// "bool", "int", "float", "string", "choice", "path" or "bytes".
REMAT_API std::string option_type_name(OptionType type);

/// An option is in effect only when another option has a given value.
struct OptionDependency {
  std::string option;  ///< the option it depends on
  std::string equals;  ///< the value (as text) that enables it, e.g. "true" or "lora"
  /// What a UI does while the dependency does not hold: "show" (hide the field) or "enable"
  /// (show it disabled), as SimpleTuner's field registry marks its dependencies.
  std::string action = "show";
};

/// A rule between two options, checked when both are set.
struct OptionRelation {
  enum class Kind { AtLeast };  ///< this value >= the other's
  Kind kind = Kind::AtLeast;
  std::string option;           ///< the other option
};

/// A value after typing and range checks: null (unset), bool, int, float or text (strings,
/// choices, paths and keywords such as "auto").
using OptionValue = std::variant<std::monostate, bool, int64_t, double, std::string>;

/// One option. All fields are fixed at registry construction.
struct OptionSpec {
  std::string name;  ///< SimpleTuner key, without "--"
  OptionType type = OptionType::String;
  std::string section;  ///< heading it is listed under (help, docs, JSON "section")
  std::string help;     ///< one-line description
  std::string tooltip;  ///< longer hint for UIs and docs; may be empty
  std::optional<double> minimum;  ///< inclusive; Int, Float and Bytes only
  std::optional<double> maximum;  ///< inclusive
  bool exclusive_minimum = false;  ///< the minimum itself is not allowed (value > minimum)
  std::vector<std::string> choices;   ///< the valid values of a Choice option
  std::vector<std::string> keywords;  ///< extra words accepted besides the type ("auto", "latest")
  /// May be unset (no value at all), written "none" (any case). Every option also accepts null
  /// and "", which mean "use the default" (for most nullable options the default is unset).
  bool nullable = false;
  std::vector<OptionDependency> depends_on;  ///< all must hold for the option to take effect
  /// Whether a value set while depends_on does not hold is warned about (dependency_diagnostics).
  /// False for settings that configs carry whatever the switch says (SimpleTuner's ema_* with
  /// use_ema false): the UI still hides them, the run says nothing.
  bool warns_when_unused = true;
  bool checkpointing = false;  ///< part of the gradient-checkpointing group (translated docs)
  std::vector<std::string> aliases;  ///< other accepted key names (SimpleTuner legacy names)
  /// Choice options: a label per choice for UIs and docs ("Recompute whole blocks (PyTorch)").
  std::map<std::string, std::string> choice_labels;
  /// Choice options: other value names accepted, each mapped to its choice (model_flavour
  /// flux-dev -> dev, flux_lora_target mmdit -> default).
  std::map<std::string, std::string> value_aliases;
  /// Values that are valid vocabulary but need training remat does not have yet, each with what
  /// it needs (flux_lora_target controlnet: "a ControlNet branch"). Validation refuses them
  /// unless --ignore_unsupported_options is given.
  std::map<std::string, std::string> unsupported_values;
  /// Choice options: for a valid value this build cannot train (base_model_precision fp8 without
  /// float8 dtypes), what it needs; std::nullopt when it trains. Decided at run time, so the
  /// generated docs do not depend on the build. Refused like unsupported_values.
  std::function<std::optional<std::string>(const std::string&)> unavailable_value;
  /// Display order in the registry (0-based), for UIs.
  int order = 0;
  /// Choices that depend on another option's value: when `choices_depend_on` is set, the value
  /// must be one of choices_by_value[that option's value] (model_flavour by model_family).
  std::string choices_depend_on;
  std::map<std::string, std::vector<std::string>> choices_by_value;
  /// String options: a regular expression the whole value must match (ECMAScript), and what it
  /// means in words for messages and docs.
  std::string pattern;
  std::string pattern_description;
  /// Rules with other options (stride >= interval), checked when both are set.
  std::vector<OptionRelation> relations;
  /// Non-empty: the option is deprecated; using it warns with this note.
  std::string deprecated;
  /// The default as text, read from a default-constructed TrainConfig; std::nullopt = unset.
  std::optional<std::string> default_value;
  /// Replaces default_value in help and docs when the default is resolved later ("= lora_rank").
  std::string default_note;

  /// Stores a typed, validated value into its TrainConfig field (the registry's binding).
  std::function<void(TrainConfig&, const OptionValue&)> assign;
  /// Reads the field back as text (std::nullopt when unset).
  std::function<std::optional<std::string>(const TrainConfig&)> render;

  /// Documentation anchor in docs/OPTIONS.md: "--" + name, as GitHub renders the heading.
  std::string doc_anchor() const;
  /// "int, default 16", "bool, default true", "int >= 1 or auto, default unset"...: what --help shows.
  std::string signature() const;
};

/// Every option, in display order (grouped by section).
REMAT_API const std::vector<OptionSpec>& option_specs();

/// The sections in display order.
REMAT_API const std::vector<std::string>& option_sections();

/// The option named `name` (or one of its aliases), leading "--" allowed; nullptr if none.
REMAT_API const OptionSpec* find_option(std::string_view name);

/// The known option name closest to `name` by edit distance (for "did you mean" messages).
REMAT_API std::string closest_option(std::string_view name);

/// The option name (remat's, an alias or SimpleTuner's) `name` is most likely a misspelling of:
/// the closest by edit distance when that distance is small (at most 1 for names of up to 4
/// characters, 2 up to 12, 3 beyond); std::nullopt when nothing is that close.
REMAT_API std::optional<std::string> suggest_option(std::string_view name);

/// "[train] unknown option '<name>'<where>", plus " (did you mean '<x>'?)" when suggest_option
/// has a suggestion.
REMAT_API std::string unknown_option_message(std::string_view name, const std::string& where);

/// The dependency rule, driven by each option's depends_on: an option whose value differs from
/// its default while an option it depends on does not have the required value is reported as a
/// warning: "X=v has no effect because D is d" when D is a switch (the value is kept, unused),
/// "X=v is only used with D=e; ignoring it" otherwise (the value is reset to its default);
/// options with warns_when_unused false are not reported.
/// `checkpointing`: check the gradient-checkpointing options (the safety check's rule 1) or the
/// others.
REMAT_API std::vector<Diagnostic> dependency_diagnostics(TrainConfig& config, bool checkpointing);

/// The relations (OptionSpec::relations) of option `name`, checked on `config` when both values
/// are set: an error per broken rule, "[train] X must be >= Y (y), got x".
REMAT_API std::vector<Diagnostic> relation_diagnostics(const TrainConfig& config, const std::string& name);

/// Parses and validates `text` as a value of `spec`: type, keywords, minimum/maximum, choices.
/// std::nullopt or empty text means "the default" (unset for nullable options). Integer options
/// accept integral floats ("16.0", "1e3"). Throws ValidationError shaped
/// `[train] <name> must be <valid>, got <text>`.
REMAT_API OptionValue parse_option_value(const OptionSpec& spec,
                                         const std::optional<std::string>& text);

/// The text of `remat train --help`: usage, then every flag with its type and default, grouped by
/// section, with its help line.
REMAT_API std::string train_help_text();

/// `remat options --json`: a JSON Schema (Draft 2020-12) of a config file: every option under its
/// name, its aliases and with a leading "--" (each accepting null), the SimpleTuner options remat
/// does not implement (accepted, listed in the run's warning), and nothing else. Each option's
/// definition also carries remat's UI metadata under "x-remat" (help, tooltip, section, order,
/// dependencies with their action, choice labels, docs link, SimpleTuner env name). Pretty-printed
/// with two spaces.
REMAT_API std::string options_json();

/// `remat options --markdown`: the text of docs/OPTIONS.md.
REMAT_API std::string options_markdown();

}  // namespace remat::train
