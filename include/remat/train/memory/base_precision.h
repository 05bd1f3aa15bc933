#pragma once
/// \file
/// `base_model_precision` as `remat train` reads it: SimpleTuner's whole vocabulary (so its
/// configs load), each name either mapped to a weight-only quantisation remat implements
/// (remat/models/quantization.h) or refused by name with what it would need and what remat
/// supports. Quantisation is for LoRA only: a full fine-tune trains the very weights that would
/// be quantised.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "remat/export.h"
#include "remat/models/quantization.h"
#include "remat/train/options/config.h"

namespace remat::train {

/// SimpleTuner's `base_model_precision` choices, in its order (quantised_precision_levels in
/// simpletuner/helpers/training/__init__.py).
REMAT_API const std::vector<std::string>& simpletuner_base_model_precisions();

/// A label per SimpleTuner name, for UIs and docs ("INT8 (Quanto), remat: int8 per-channel").
REMAT_API std::map<std::string, std::string> base_model_precision_labels();

/// The SimpleTuner names remat does not implement, each with what it needs ("4-bit integer
/// weights"). Every other SimpleTuner name is in models::supported_base_model_precisions().
REMAT_API std::map<std::string, std::string> unsupported_base_model_precisions();

/// What a supported name needs that this build lacks (fp8 without float8 dtypes: the
/// requirement), or std::nullopt when it trains here. For names unsupported everywhere, also
/// std::nullopt (unsupported_base_model_precisions covers them).
REMAT_API std::optional<std::string> base_model_precision_unavailable(const std::string& name);

/// The rule between base_model_precision and model_type: an error when a quantised base is asked
/// for a full fine-tune (the weights being trained cannot be frozen quantised copies), as
/// SimpleTuner's registry enables the option only for model_type lora. Empty when fine.
REMAT_API std::vector<Diagnostic> base_model_precision_diagnostics(const TrainConfig& config);

/// base_model_precision `text` read through the options registry's row, for the commands that take
/// it without a whole config (`remat bench`, `remat sample`): its choices (SimpleTuner's names),
/// then a name remat lacks or this build lacks is refused with what it needs. Throws
/// ValidationError naming the option; each message starts with "[<command>] ".
REMAT_API models::BasePrecision parse_base_model_precision_option(const std::string& text, const std::string& command);

/// The precision a validated config trains with (no_change when unset).
REMAT_API models::BasePrecision base_precision_of(const TrainConfig& config);

}  // namespace remat::train
