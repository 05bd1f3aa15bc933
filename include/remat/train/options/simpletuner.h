#pragma once
/// \file
/// What remat knows about SimpleTuner's own option names, beyond the ones it implements: every
/// name SimpleTuner accepts, the group it belongs to (tracking, hub, quantisation, validation, ...),
/// whether it changes what training computes, and SimpleTuner's config.env names. The table is
/// data (src/train/options/simpletuner_options.inc); config validation classifies every key with it:
///   (a) an option of remat's registry (remat/train/options/options.h),
///   (b) a SimpleTuner option remat does not implement: listed in one grouped warning, or an error
///       when it changes what training computes (see SimpleTunerOption::neutral), or
///   (c) unknown to both: an error.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "remat/export.h"

namespace remat::train {

/// One of SimpleTuner's option names.
struct SimpleTunerOption {
  std::string name;   ///< the key, without "--"
  std::string group;  ///< "remat" when remat implements it; else its group ("tracking", ...)
  /// True when setting it to another value than null or `neutral` changes what training
  /// computes: remat refuses such a config unless --ignore_unsupported_options is given.
  bool changes_training = false;
  /// For changes_training: the value (as text after JSON typing) that leaves training as remat
  /// runs it ("false", "0", "no_change", "{}"); empty: only null does.
  std::string neutral;
  /// For changes_training: what it does, for the error ("quantises the frozen base weights").
  std::string effect;

  /// True when `value` (text; std::nullopt = null) leaves training unchanged: null, "", "none"
  /// (any case), the neutral value, or for a numeric neutral any number equal to it.
  bool is_neutral(const std::optional<std::string>& value) const;
};

/// Every SimpleTuner option name, sorted by name.
REMAT_API const std::vector<SimpleTunerOption>& simpletuner_options();

/// The SimpleTuner option named `name` (leading "--" allowed), or nullptr.
REMAT_API const SimpleTunerOption* find_simpletuner_option(std::string_view name);

/// The groups in the order the warning lists them, each with its title ("tracking and logging").
REMAT_API const std::vector<std::pair<std::string, std::string>>& simpletuner_groups();

/// A config.env name of SimpleTuner's (TRAINING_SEED) and the option it sets (seed); `value` is
/// a fixed value to use instead of the file's (empty: the file's).
struct SimpleTunerEnvName {
  std::string env;
  std::string option;
  std::string value;
};

/// SimpleTuner's config.env names (helpers/configuration/env_file.py's table).
REMAT_API const std::vector<SimpleTunerEnvName>& simpletuner_env_names();

/// The env name entry for `env`, or nullptr.
REMAT_API const SimpleTunerEnvName* find_simpletuner_env_name(std::string_view env);

/// The config.env name that sets `option`, if SimpleTuner has one (the first in its table).
REMAT_API std::optional<std::string> simpletuner_env_name_of(std::string_view option);

}  // namespace remat::train
