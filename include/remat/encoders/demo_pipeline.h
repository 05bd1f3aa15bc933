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
  /// one diffusion_pytorch_model.safetensors).
  int64_t transformer_shards = 2;
};

/// One component of the demo folder: its model_index.json entry and the function that writes its
/// directory `<root>/<name>`.
struct DemoComponentWriter {
  std::string name;
  std::string library;
  std::string class_name;
  std::function<void(const std::string& component_dir, const DemoPipelineOptions& options)> write;
};

/// The components the demo folder has, in writing order. New components (vae, text_encoder,
/// text_encoder_2, tokenizer, tokenizer_2) are added here as their modules arrive.
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

/// Writes the whole folder: each component of demo_pipeline_components(), then model_index.json
/// (last, so a folder with a model_index.json is complete). `root` must not already hold a
/// model_index.json. Throws c10::ValueError naming the problem. Returns the components written.
REMAT_API std::vector<std::string> write_demo_pipeline(const std::string& root, const DemoPipelineOptions& options = {});

}  // namespace remat::encoders
