#pragma once
/// \file
/// A tiny diffusers Flux pipeline folder with random weights (`remat make-demo-pipeline`), for
/// tests and demos of loading a pipeline folder without downloading the 30 GB published one.
/// Every component has its own writer; the folder's model_index.json names exactly the
/// components written ([null, null] for the others), so it is a valid folder at every stage.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "remat/encoders/autoencoder_kl_config.h"
#include "remat/encoders/clip_text_model.h"
#include "remat/encoders/t5_config.h"
#include "remat/export.h"
#include "remat/models/flux.h"

namespace remat::encoders {

struct DemoPipelineOptions {
  uint64_t seed = 0;
  /// The transformer's architecture (a models::FluxConfig preset).
  std::string transformer_preset = "flux-tiny";
  /// Weight dtype of the files: "bf16" (as every published FLUX.1 file) or "fp32".
  std::string dtype = "bf16";
  /// The transformer's weights are cut with a shard limit of total / transformer_shards, which
  /// under the hub's rule gives this many shards or one more (>= 2 exercises the index; 1 writes
  /// one diffusion_pytorch_model.safetensors). Flux only: MageFlow's demo transformer is one file,
  /// as upstream's loaders read it.
  int64_t transformer_shards = 2;
};

/// The diffusers version the demo folders' files claim to come from.
REMAT_API const char* demo_diffusers_version();

/// One component of the demo folder: its model_index.json entry and the function that writes its
/// directory `<root>/<name>`.
struct DemoComponentWriter {
  std::string name;
  std::string library;
  std::string class_name;
  std::function<void(const std::string& component_dir, const DemoPipelineOptions& options)> write;
};

/// The components the demo folder has, in writing order: every component of a FluxPipeline.
REMAT_API std::vector<DemoComponentWriter> demo_pipeline_components();

/// diffusers' transformer/config.json for `config` (`_class_name` FluxTransformer2DModel and every
/// architecture field FluxConfig::from_json reads).
REMAT_API std::string flux_transformer_config_json(const models::FluxConfig& config);

/// FLUX.1-dev's scheduler/scheduler_config.json (FlowMatchEulerDiscreteScheduler: shift 3.0 with
/// dynamic shifting between base_shift 0.5 at 256 image tokens and max_shift 1.15 at 4096).
REMAT_API std::string flux_dev_scheduler_config_json();

/// Writes the transformer component: random weights of the preset (seeded), config.json, and the
/// weights sharded (about options.transformer_shards files) with an index.
REMAT_API void write_demo_transformer(const std::string& component_dir, const DemoPipelineOptions& options);
/// Writes scheduler/scheduler_config.json.
REMAT_API void write_demo_scheduler(const std::string& component_dir, const DemoPipelineOptions& options);

/// The demo encoders' configurations, shaped to fit `transformer`: the VAE's latent channels are
/// in_channels / 4 (Flux packs 2 x 2 latent patches), CLIP's width is pooled_projection_dim and
/// T5's d_model is joint_attention_dim, so encoded pictures and captions train the transformer.
/// T5's vocabulary is the tokenizer's (pieces + 100 extra ids).
REMAT_API AutoencoderKLConfig demo_vae_config(const models::FluxConfig& transformer);
REMAT_API ClipTextConfig demo_clip_config(const models::FluxConfig& transformer);
REMAT_API T5Config demo_t5_config(const models::FluxConfig& transformer, int64_t tokenizer_vocab_size);

/// The encoder components (random weights, seeded per component) and their tokenizers: a tiny
/// CLIP vocabulary and merges (write_tiny_clip_tokenizer) and a SentencePiece model trained with
/// Debian's library (train_tiny_spiece_model). text_encoder_2 reads tokenizer_2, written first.
REMAT_API void write_demo_vae(const std::string& component_dir, const DemoPipelineOptions& options);
REMAT_API void write_demo_text_encoder(const std::string& component_dir, const DemoPipelineOptions& options);
REMAT_API void write_demo_text_encoder_2(const std::string& component_dir, const DemoPipelineOptions& options);
REMAT_API void write_demo_tokenizer(const std::string& component_dir, const DemoPipelineOptions& options);
REMAT_API void write_demo_tokenizer_2(const std::string& component_dir, const DemoPipelineOptions& options);

/// Writes the whole folder: each component of demo_pipeline_components(), then model_index.json
/// (last, so a folder with a model_index.json is complete). `root` must not already hold a
/// model_index.json. Throws c10::ValueError naming the problem. Returns the components written.
REMAT_API std::vector<std::string> write_demo_pipeline(const std::string& root, const DemoPipelineOptions& options = {});

}  // namespace remat::encoders
