#pragma once
/// \file
/// Hugging Face model ids in a training config, found in the local hub cache (remat/io/hub_cache.h)
/// before anything reads them, as SimpleTuner's from_pretrained calls find them offline.

#include <string>
#include <vector>

#include "remat/export.h"
#include "remat/train/options/config.h"

namespace remat::train {

/// Replaces every model option given as a hub id, pretrained_model_name_or_path,
/// pretrained_transformer_model_name_or_path and pretrained_vae_model_name_or_path, by its
/// snapshot folder at config.revision (main when unset). A value that exists as a local path is
/// left alone. Unset pretrained_model_name_or_path (and no transformer override) with a published
/// flavour means the flavour's hub id (FlavourSpec::hub_id, SimpleTuner's HUGGINGFACE_PATHS);
/// kRandomWeights becomes unset (random initialisation). Returns one line per resolution for the
/// run's log: the option, the id, the revision, the commit and the folder.
///
/// Throws c10::ValueError ("[train] ...", exit 2) when the model or the transformer override is
/// not in the cache, lacks its revision, or its snapshot is not a pipeline folder with a
/// transformer or a transformer folder: the message names the id, the revision, every path looked
/// at, the missing files and the `hf download` command that fetches them. A VAE id not in the
/// cache is not an error (training reads latents from the cache): it stays as given and
/// resolve_model_source notes it.
REMAT_API std::vector<std::string> resolve_hub_models(TrainConfig& config);

}  // namespace remat::train
