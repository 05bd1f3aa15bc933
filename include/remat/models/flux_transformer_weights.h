#pragma once
/// \file
/// Loading a Flux transformer from whatever the user points at: a .safetensors file or a
/// component folder (config.json + weights, possibly sharded), in diffusers' layout or Black
/// Forest Labs' single-file layout (remat/models/flux_weight_formats.h); a folder's files are
/// found as remat/models/component_weights.h finds any component's.

#include <optional>
#include <string>

#include "remat/export.h"
#include "remat/models/flux.h"

namespace remat::models {

/// Loads `file_or_component_dir` strictly into `model` (models::load_flux_weights): a folder's
/// weight files are found and checked with open_component_weights. Throws c10::ValueError /
/// c10::Error naming the file and key on any problem; the model is untouched then.
REMAT_API void load_flux_transformer_weights(models::FluxImpl& model, const std::string& file_or_component_dir,
                                             const std::string& variant = {});

/// The FluxConfig for `file_or_component_dir`: the folder's config.json, else (a single BFL file
/// without a config) the config inferred from its shapes (models::flux_config_from_bfl); nullopt
/// for a diffusers-layout file (its config must come from elsewhere).
REMAT_API std::optional<models::FluxConfig> flux_config_for_weights(const std::string& file_or_component_dir);

}  // namespace remat::models
