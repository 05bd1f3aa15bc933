#pragma once
/// \file
/// The model-family registry. A model family is everything remat knows about one architecture,
/// in one descriptor registered from one file (src/train/families/<name>.cpp): its name and
/// presets, its latent-cache layout, its checkpointing capabilities and block stacks, its LoRA
/// targets, its own options, how to build the transformer (the one way: any weight layout, any
/// dtype, quantised or not), its encoders, its pipelines' scheduler and the denoising loop its
/// transformer samples with (Transformer::denoiser). Options, validation, docs,
/// `remat options --json`, the safety check, data loading and caching, `remat sample`,
/// validation images, the demo's quality check, `make-demo-data`, `remat bench` and LoRA
/// targeting all read it; nothing else names a family. docs/ARCHITECTURE.md lists what a family
/// provides and how to add one.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "remat/encoders/model_encoders.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/export.h"
#include "remat/models/lora.h"
#include "remat/sample/scheduler.h"
#include "remat/train/data/data.h"

namespace remat::encoders {
struct DemoPipelineOptions;
}  // namespace remat::encoders

namespace remat::train {

class Transformer;
struct TransformerSpec;
struct TrainConfig;
struct OptionSpec;

/// What a family's transformer supports for gradient checkpointing.
struct CheckpointingCapabilities {
  bool interval = false;        ///< contiguous chunks of N blocks (gradient_checkpointing_interval)
  bool segment_stride = false;  ///< chunks starting every S blocks (..._segment_stride)
  bool ffn_scope = false;       ///< "-ffn" backends: checkpoint only the feed-forward half
  /// The block stacks in execution order (Flux: "double blocks", "single blocks"); each stack
  /// start is a forced segment boundary and windows restart at 0 in each.
  std::vector<std::string> stacks;
  /// musubi_blocks_to_swap: the last blocks' frozen weights streamed from host memory
  /// (Transformer::set_block_swap).
  bool block_swap = false;
  /// The modules holding the block stacks, in run order (Flux: "transformer_blocks",
  /// "single_transformer_blocks"): how the memory model finds a block's Linears by name.
  std::vector<std::string> block_stack_modules;
  /// gradient_checkpointing_offload_attention: the blocks' attention runs inside a saved-tensor
  /// offload scope (Transformer::set_attention_offload).
  bool attention_offload = false;
};

/// One model_flavour of a family: SimpleTuner's name for a published model (dev, krea, base,
/// turbo, ...) or one of remat's small test configurations (flux-tiny), and what it builds.
struct FlavourSpec {
  std::string name;    ///< the model_flavour value
  std::string preset;  ///< the models:: preset it builds (FluxConfig::preset / MageFlowConfig::preset)
  std::string summary; ///< what it is and what it changes, for docs, help and UIs
  /// Non-empty: what training it needs that remat lacks ("reference-image conditioning"): using
  /// it is an unsupported-computation error unless --ignore_unsupported_options is given.
  std::string unsupported;
  /// The Hugging Face model id SimpleTuner loads for the flavour when no path is given (its
  /// HUGGINGFACE_PATHS); empty for remat's small configurations, which start from random weights.
  std::string hub_id = {};
  /// Trains on picture pairs (FLUX.1 Kontext): every image dataset needs a conditioning dataset of
  /// reference pictures (remat/data/dataset_config.h), and no other flavour accepts one.
  bool trains_on_pairs = false;
  /// Non-empty: the flavour is published for picture pairs that remat cannot train (MageFlow's edit
  /// flavours), and why; a dataset with reference pictures is refused with it.
  std::string pairs_unsupported = {};
};

/// The widths of a flavour's text conditioning: what a latent cache for it must hold.
struct ConditioningWidths {
  int64_t text = 0;      ///< D of prompt_embeds
  int64_t pooled = 0;    ///< P of pooled_prompt_embeds (0: none)
  int64_t channels = 0;  ///< C of the latents the model reads (0: not checked)
};

/// The attention a model runs in one step, from its config alone.
struct AttentionLayers {
  /// Attention layers over each sample's image and text tokens together (Flux: every double and
  /// single block).
  int64_t count = 0;
  int64_t heads = 0;  ///< heads of each
};

/// What `remat plan`'s memory model (remat/train/memory/training_plan.h) needs of a family, from
/// its config alone: the model measured at four narrow widths stands in for the real one.
struct PlanProxy {
  int64_t heads = 0;      ///< attention heads of the real model
  int64_t head_dim = 0;   ///< their size (the proxies keep it)
  std::vector<int64_t> stack_sizes;  ///< blocks per stack, in run order
  /// The same architecture with `blocks_per_stack` blocks in each stack and `heads_of_proxy`
  /// heads of head_dim each (every width that follows from the hidden size scales with it), as
  /// a spec carrying its config JSON text.
  std::function<TransformerSpec(int64_t heads_of_proxy, int64_t blocks_per_stack)> proxy;
  /// Forward FLOPs of one block of stack `stack` for one sample of `image_tokens` and
  /// `text_tokens` (matrix products: 2 per multiply-add).
  std::function<double(size_t stack, int64_t image_tokens, int64_t text_tokens)> block_forward_flops;
};

/// What a family's pipelines default to when called (diffusers' __call__ arguments): `remat sample`
/// uses them for the options a user leaves unset.
struct PipelineDefaults {
  int64_t num_inference_steps = 28;  ///< FluxPipeline: 28
  double guidance_scale = 3.5;       ///< FluxPipeline: 3.5 (embedded guidance)
  int64_t max_sequence_length = 512; ///< FluxPipeline: 512
};

struct ModelFamily {
  /// The model_family value (SimpleTuner's --model_family).
  std::string name;
  /// For people ("Flux.1").
  std::string display_name;
  /// The model_flavour values with what each builds, published models first. Required.
  std::vector<FlavourSpec> flavour_specs;
  /// Their names, in the same order (filled by register_family).
  std::vector<std::string> flavours;
  /// Older flavour names still accepted (with a warning), each mapped to a current one.
  std::map<std::string, std::string> flavour_aliases;
  /// The flavour when model_flavour is unset (SimpleTuner's default for the family).
  std::string default_flavour;
  /// A small flavour for commands that build a model to try something (`remat init`).
  std::string small_flavour;
  /// Flavour-dependent settings, run by validation once options are typed: adjusts `config` as
  /// SimpleTuner does for the flavour (FluxBooru's fixed guidance value) and returns warnings.
  /// `given` holds the options the user set.
  std::function<std::vector<std::string>(TrainConfig& config, const std::vector<std::string>& given)>
      apply_flavour;
  /// What its latent cache holds.
  LatentLayout latents;
  /// Its text encoders and autoencoder in a pipeline folder (Flux's VAE, CLIP and T5): image
  /// datasets, `remat cache`, sampling and validation load them. Unset
  /// (!encoders.available()): only latent caches made elsewhere train it.
  encoders::FamilyEncoders encoders;
  /// model_index.json `_class_name` values of its diffusers pipelines ("FluxPipeline"):
  /// `remat sample` picks the family of a folder by them (remat/train/family/text_to_image.h).
  std::vector<std::string> pipeline_classes;
  /// Those of pipeline_classes that edit an input picture as FLUX.1 Kontext's does
  /// (sample::TextToImage::edits_pictures: "FluxKontextPipeline").
  std::vector<std::string> picture_editing_pipeline_classes;
  /// Whether its pipelines' guidance_scale is classifier-free guidance on a negative prompt
  /// (MageFlowPipeline) rather than a value the transformer embeds (FLUX.1-dev): validation's
  /// validation_guidance and `remat sample --guidance_scale` then set SamplingSettings::true_cfg_scale,
  /// and a negative prompt is encoded when it is above 1.
  bool guidance_is_cfg = false;
  /// Its pipelines' __call__ defaults.
  PipelineDefaults pipeline_defaults;
  /// The most text tokens its pipelines take (FluxPipeline.check_inputs: 512).
  int64_t max_sequence_length = 512;
  /// Its pipelines' scheduler: the folder's scheduler/ config when it has one, else the published
  /// one of `flavour`. Unset: the family does not sample.
  std::function<sample::FlowMatchSchedulerConfig(const encoders::PipelineFolder& folder, const std::string& flavour)>
      scheduler;
  /// Writes a tiny pipeline folder of the family with random weights (`remat make-demo-pipeline`;
  /// options.transformer_preset is one of its presets) and returns the components written. Unset:
  /// the family has no demo folder.
  std::function<std::vector<std::string>(const std::string& root, const encoders::DemoPipelineOptions& options)>
      write_demo_pipeline;
  /// Checks, from the configs alone, that a pipeline folder's components fit each other and the
  /// transformer of `spec` (the widths they exchange), so a folder assembled from different models
  /// fails before anything loads. Throws c10::ValueError naming the files. Unset: not checked.
  std::function<void(const encoders::PipelineFolder& folder, const TransformerSpec& spec)> check_pipeline;
  CheckpointingCapabilities checkpointing;
  /// LoRA target presets (the first is the default) and the modules each one wraps.
  std::vector<std::string> lora_target_presets;
  std::function<std::vector<std::string>(const std::string& preset)> lora_target_modules;
  /// The LoRA target preset a run uses (Flux: its flux_lora_target option). Default: the first.
  std::function<std::string(const TrainConfig&)> lora_target_of;
  /// Options only this family has (Flux: flux_lora_target, flux_guidance_value). They join the
  /// registry of remat/train/options/options.h, each bound to a TrainConfig field.
  std::function<std::vector<OptionSpec>()> options;
  /// Builds the transformer (float32 weights on `device`, spec.weights loaded strictly).
  std::function<std::unique_ptr<Transformer>(const TransformerSpec&, const c10::Device&)> build;
  /// The conditioning widths of a flavour or config.json (for demo data that fits the model, and
  /// to check a dataset against the model before training starts).
  std::function<ConditioningWidths(const TransformerSpec&)> conditioning;
  /// The parameters the transformer of a spec registers, and its Linear layers (names, shapes),
  /// from the config alone: memory admission (remat/train/memory/admission.h) sizes a model and its
  /// LoRA with them before allocating. Unset: models of the family are built unchecked.
  std::function<int64_t(const TransformerSpec&)> parameter_count;
  std::function<std::vector<models::LinearShape>(const TransformerSpec&)> linear_layers;
  /// Its attention layers, from the config alone: where attention materialises its score
  /// matrices (LibTorch 1.13, remat/compat.h), those grow with the square of the tokens, and the
  /// UI's planner refuses a step profile whose scores alone would exceed its memory limit before
  /// starting it. Unset: not sized.
  std::function<AttentionLayers(const TransformerSpec&)> attention_layers;
  /// The shape `remat plan` models a spec with (PlanProxy). Unset: the family is not planned.
  std::function<PlanProxy(const TransformerSpec&)> plan_proxy;

  /// Whether it samples pictures (encoders and a scheduler; its Transformer's denoiser).
  bool samples() const { return encoders.available() && static_cast<bool>(scheduler); }
  /// Whether remat encodes pictures and captions for it (image datasets, `remat cache`).
  bool encodes_images() const { return encoders.available(); }

  /// The LoRA target preset of `config`.
  std::string lora_target(const TrainConfig& config) const;
  /// The flavour `name` (a current name or an alias), or nullptr.
  const FlavourSpec* flavour(const std::string& name) const;
  /// The models:: preset of flavour `name` (current, alias, or a preset name itself); throws
  /// c10::ValueError listing the flavours when it is none of them.
  std::string preset_of(const std::string& name) const;
};

/// Adds `family` to the registry (replacing one of the same name). Register families before
/// options are read or models built: the registry is not synchronised against concurrent use.
/// Throws c10::ValueError when a required field (name, flavour_specs, build) is missing.
REMAT_API void register_family(ModelFamily family);

/// The family named `name`; throws c10::ValueError listing the registered names.
REMAT_API const ModelFamily& model_family(const std::string& name);
/// The family named `name`, or nullptr.
REMAT_API const ModelFamily* find_model_family(const std::string& name);
/// Every registered name, in registration order (the built-in ones first).
REMAT_API std::vector<std::string> model_family_names();
/// Every registered family, in registration order.
REMAT_API std::vector<const ModelFamily*> model_families();
/// Incremented by every registration: lets caches of derived tables (the options registry)
/// notice a new family.
REMAT_API uint64_t model_family_generation();

}  // namespace remat::train
