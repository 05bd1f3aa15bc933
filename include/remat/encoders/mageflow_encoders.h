#pragma once
/// \file
/// MageFlow's pipeline folder and encoders, as the MageFlow family hands them out
/// (remat/encoders/model_encoders.h FamilyEncoders).
///
/// The folder is a Mage-Flow repository as SimpleTuner reads it (simpletuner/helpers/models/mageflow/
/// model.py and vendor/pipeline.py load_from_repo, at bc8e6ab7): model_index.json, transformer/
/// (config.json and the weights), vae/ (Mage-VAE's diffusion_pytorch_model.safetensors, with or
/// without a config.json), text_encoder/ (Qwen3-VL's config.json, weights and tokenizer.json) and an
/// optional scheduler/. model_index.json's `_vae_source` and `_text_encoder_path`, when present,
/// say where the VAE and the text encoder are, as the vendored loader reads them.
///
/// Text: MageFlowTextEncoder (remat/encoders/mageflow_text_encoder.h), the edit template for the edit
/// flavours (or an edit pipeline's folder when no flavour is given). Pictures: Mage-VAE
/// (remat/encoders/mage_vae.h); latents are the posterior mean, unscaled, whatever the generator
/// (SimpleTuner's MageVAE has sample_posterior False), and decoded pictures become pixels as
/// SimpleTuner's pipeline makes them (PixelConversion::clamp_truncate).

#include <cstdint>
#include <string>

#include <c10/core/ScalarType.h>

#include "remat/encoders/mage_vae.h"
#include "remat/encoders/model_encoders.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/encoders/qwen3_text_model.h"
#include "remat/export.h"

namespace remat::encoders {

/// MageFlowPipeline's (and MageFlowEditPipeline's) layout: scheduler, text_encoder, transformer, vae.
REMAT_API const PipelineLayout& mageflow_pipeline_layout();

/// Whether prompts of `flavour` (or, when it is empty, of the folder's pipeline class) use the edit
/// template: the edit flavours and MageFlowEditPipeline folders do (mageflow/model.py
/// _is_edit_flavour).
REMAT_API bool mageflow_uses_edit_template(const std::string& flavour, const std::string& pipeline_class);

/// The folder's Mage-VAE sizes: vae/config.json when there is one (MageVaeConfig::from_json_file),
/// otherwise the published ones.
REMAT_API MageVaeConfig mage_vae_config_of(const PipelineFolder& folder);
/// The folder's text encoder config (text_encoder/config.json).
REMAT_API Qwen3TextConfig mageflow_text_config_of(const PipelineFolder& folder);

/// Peak bytes of Mage-VAE's activations while it encodes or decodes one width x height picture
/// with elements of `element_bytes`, from the sizes alone: decoding is the larger, dominated by the
/// per-pixel head (hidden_size_x channels at every pixel) and the CoD decoder's attention windows.
REMAT_API int64_t mage_vae_peak_bytes(const MageVaeConfig& config, int64_t width, int64_t height,
                                      int64_t element_bytes);

/// The encoders of a MageFlow pipeline folder.
REMAT_API FamilyEncoders mageflow_family_encoders();

}  // namespace remat::encoders
