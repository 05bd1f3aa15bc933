#pragma once
/// \file
/// Where `remat train` takes the transformer from: pretrained_model_name_or_path as a diffusers
/// pipeline folder, a transformer folder or a single .safetensors file, with SimpleTuner's
/// per-component overrides (docs/PIPELINE_FOLDER.md).

#include <optional>
#include <string>

#include "remat/export.h"
#include "remat/train/options/config.h"
#include "remat/train/family/transformer.h"

namespace remat::train {

struct ModelSource {
  /// What TransformerSpec::weights gets: a .safetensors file or a component directory. Unset:
  /// random initialisation.
  std::optional<std::string> weights;
  /// What TransformerSpec::config_json gets: pretrained_transformer_config when set, otherwise
  /// the component directory's config.json (unset for a single file: the flavour's shapes).
  std::optional<std::string> config_json;
  /// The pipeline folder the transformer came from, if any.
  std::optional<std::string> pipeline_folder;
  /// The VAE directory when one was given or resolved (checked, not loaded).
  std::optional<std::string> vae_directory;
  /// Set when pretrained_vae_model_name_or_path is not a local folder (a hub repository name):
  /// it is not needed for training and is not read.
  std::string vae_note;
  /// One line for the log.
  std::string describe() const;
};

/// Resolves and checks the model source of `config` (every folder validated with
/// remat/encoders/pipeline_folder.h). Throws c10::ValueError naming the option, the path and
/// what was expected.
REMAT_API ModelSource resolve_model_source(const TrainConfig& config);

/// The TransformerSpec of `config`'s model: its family and flavour, with `source`'s config.json and
/// weights (float32, the base unquantised: the caller sets base_precision and dtype when it needs).
REMAT_API TransformerSpec transformer_spec_of(const TrainConfig& config, const ModelSource& source);

}  // namespace remat::train
