#pragma once
/// \file
/// A tiny MageFlow pipeline folder with random weights (`remat make-demo-pipeline --model_family
/// mageflow`), in the layout of remat/encoders/mageflow_encoders.h: model_index.json
/// (MageFlowPipeline, with `_vae_source` and `_text_encoder_path` as the vendored loader reads them),
/// transformer/ (a MageFlowConfig preset in one file, as upstream's loaders read it), vae/ (Mage-VAE
/// in upstream's checkpoint layout, small sizes in its config.json), text_encoder/ (a Qwen3-VL
/// config.json, the language model's weights under their Qwen3-VL names, a small real-format Qwen2
/// tokenizer.json) and scheduler/ (MageFlowPipeline's default: shift 6, no dynamic shifting).

#include <string>
#include <vector>

#include "remat/encoders/demo_pipeline.h"
#include "remat/encoders/mage_vae.h"
#include "remat/encoders/qwen3_text_model.h"
#include "remat/export.h"
#include "remat/models/mageflow.h"

namespace remat::encoders {

/// The demo components' sizes, shaped to fit `transformer`: the VAE's latent channels are its
/// in_channels, the text model's width its context_in_dim; the text model's vocabulary is the
/// demo tokenizer's (`tokenizer_vocab_size`).
REMAT_API MageVaeConfig mageflow_demo_vae_config(const models::MageFlowConfig& transformer);
REMAT_API Qwen3TextConfig mageflow_demo_text_config(const models::MageFlowConfig& transformer,
                                                    int64_t tokenizer_vocab_size);

/// Qwen3-VL's text_encoder/config.json for `text` (architectures Qwen3VLForConditionalGeneration,
/// the language model's fields under "text_config").
REMAT_API std::string qwen3_vl_config_json(const Qwen3TextConfig& text);

/// Writes the whole folder (options.transformer_preset must be a MageFlowConfig preset), then
/// model_index.json last. `root` must not already hold a model_index.json. Returns the components
/// written. Throws c10::ValueError naming the problem.
REMAT_API std::vector<std::string> write_mageflow_demo_pipeline(const std::string& root,
                                                                const DemoPipelineOptions& options);

}  // namespace remat::encoders
