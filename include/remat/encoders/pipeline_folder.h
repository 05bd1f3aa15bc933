#pragma once
/// \file
/// A diffusers pipeline folder (what `FluxPipeline.save_pretrained` writes and the Hugging Face
/// hub serves) as a model source: `model_index.json` naming the components, one directory per
/// component, and in each weight directory a `config.json` plus safetensors weights, whole or
/// sharded with an index. docs/PIPELINE_FOLDER.md describes the layout for users.
///
/// Every check is strict and every error is a c10::ValueError starting with "[pipeline]" that
/// names the file and, where one is at fault, the tensor key.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "remat/export.h"
#include "remat/io/safetensors.h"

namespace remat::encoders {

/// The weight files of one component directory, as the diffusers / transformers conventions
/// name them.
struct ComponentWeights {
  std::string directory;
  /// The base name: "diffusion_pytorch_model" (diffusers models) or "model" (transformers).
  std::string base;
  /// The index file (`<base>.safetensors.index.json`) of a sharded component; unset otherwise.
  std::optional<std::string> index;
  /// Full paths of the weight files: the one `<base>.safetensors`, or every shard the index
  /// names, sorted and each listed once.
  std::vector<std::string> files;
  /// Sharded: tensor key -> shard file name (as the index writes it). Empty when unsharded.
  std::map<std::string, std::string> weight_map;
};

/// Finds the weights of `component_dir`: `diffusion_pytorch_model.safetensors.index.json` or
/// `diffusion_pytorch_model.safetensors` (diffusers), or `model.safetensors.index.json` or
/// `model.safetensors` (transformers); an index wins over the whole file of the same name, as in
/// diffusers' from_pretrained, and files of both names at once are ambiguous (an error). Reads and checks the index (remat/io/bounded_json.h
/// bounds; an object with a `weight_map` object of key -> plain file name in the same directory).
/// Throws naming the directory and what was expected when there is none or more than one, when
/// only variant files (`*.fp16.safetensors` ...) or pickle files (`*.bin`) exist (not read: a
/// variant must be renamed to the plain names, and pickles can run code), or when the index is
/// malformed. Does not open the shards.
REMAT_API ComponentWeights find_component_weights(const std::string& component_dir);

/// find_component_weights, then opens and validates every weight file. For a sharded component
/// the index and the shards must agree exactly: a shard the index names must exist, every key the
/// index maps to a shard must be in that shard, and every key in a shard must be mapped by the
/// index to that shard; each violation throws naming the index, the shard and the key.
REMAT_API std::vector<io::SafetensorsFile> open_component_weights(const std::string& component_dir);

/// Loads the component in `component_dir` into `module`, converting each tensor straight from
/// the mapping into the dtype of its destination (no intermediate copy: a bf16 file loads into
/// a bf16 module with no float32 tensor). With options.strict (the default) every key is checked
/// first and one error lists each missing, unexpected or shape-mismatched key with the file that
/// holds it; the module is untouched on error.
REMAT_API io::LoadReport load_component(const std::string& component_dir, torch::nn::Module& module,
                                        const io::LoadOptions& options = {});

/// The shard size of the hub's writers: 10 GB, as diffusers' save_pretrained defaults to.
inline constexpr uint64_t kDefaultMaxShardBytes = uint64_t{10} * 1000 * 1000 * 1000;

/// Writes `module` as a component directory: `config.json` (the text given, checked to be a JSON
/// object) and its weights, named with `base` ("diffusion_pytorch_model" or "model"). The state
/// dict is cut into shards like huggingface_hub's rule: tensors in module order, a new shard when
/// the next tensor would take the current one past `max_shard_bytes` (a tensor larger than the
/// limit gets a shard of its own). One shard is written as `<base>.safetensors`; more as
/// `<base>-0000i-of-0000n.safetensors` plus `<base>.safetensors.index.json` ({"metadata":
/// {"total_size": bytes}, "weight_map": {key: file}}). Every file is written to a temporary file
/// and renamed; weight files of the other layout left by an earlier save are removed, so the
/// directory never holds two layouts. Creates the directory if needed.
REMAT_API void save_component(const std::string& component_dir, const torch::nn::Module& module,
                              const std::string& config_json_text,
                              uint64_t max_shard_bytes = kDefaultMaxShardBytes,
                              const std::string& base = "diffusion_pytorch_model");

/// One kind of component a pipeline folder can hold, as model_index.json names it.
struct ComponentKind {
  std::string name;                  ///< its key and directory ("vae")
  std::string library;               ///< "diffusers" or "transformers"
  std::vector<std::string> classes;  ///< the classes accepted ("AutoencoderKL")
  std::string marker;                ///< the file that marks its directory complete ("config.json")
  bool weights = false;              ///< it has safetensors weights (find_component_weights)
};

/// What one model family's pipeline folders hold: the model_index.json `_class_name` values and
/// the components, in model_index.json's order of keys (alphabetical). The family's encoders carry
/// it (remat/encoders/model_encoders.h FamilyEncoders::layout).
struct PipelineLayout {
  std::vector<std::string> pipeline_classes;  ///< "FluxPipeline"
  std::string reads;                          ///< for errors: "remat reads Flux pipeline folders"
  std::vector<ComponentKind> components;
};

/// FluxPipeline's layout: scheduler, text_encoder (CLIP), text_encoder_2 (T5), tokenizer,
/// tokenizer_2, transformer, vae.
REMAT_API const PipelineLayout& flux_pipeline_layout();
/// The components of a FluxPipeline, in model_index.json's order of keys (alphabetical).
REMAT_API const std::vector<std::string>& flux_pipeline_components();

/// Where one component comes from instead of `<root>/<component>`.
struct ComponentOverride {
  /// A pipeline folder or a component folder (SimpleTuner's *_model_name_or_path).
  std::string path;
  /// The subfolder of `path` holding the component (SimpleTuner's pretrained_transformer_subfolder,
  /// default "transformer"); empty, or "none" in any case: `path` itself. When unset, `path` is
  /// used itself if it is a component folder (has config.json) and `path/<component>` otherwise.
  std::optional<std::string> subfolder;
};

/// One resolved component.
struct PipelineComponent {
  std::string name;             ///< "transformer", "vae" ...
  std::string library;          ///< from model_index.json ("diffusers", "transformers"); empty for an override
  std::string class_name;       ///< from model_index.json, or config.json's `_class_name` for an override
  std::string directory;        ///< the directory that holds it
  bool overridden = false;      ///< came from a ComponentOverride
};

/// A validated diffusers pipeline folder of one PipelineLayout (FluxPipeline's unless told).
struct REMAT_API PipelineFolder {
  std::string root;
  std::string diffusers_version;  ///< model_index.json's `_diffusers_version` (empty if absent)
  /// The required components and every other component model_index.json names that exists on
  /// disk or is overridden, by name.
  std::map<std::string, PipelineComponent> components;

  /// Reads and validates `<root>/model_index.json`: a JSON object (bounded parse) whose
  /// `_class_name` is one of layout.pipeline_classes and whose other non-underscore keys each hold [library,
  /// class] strings, or [null, null] for an absent optional component. Each of
  /// `required_components` must be named with a class and have its directory: `overrides` (by
  /// component name) replaces where it is looked for. Each needs its kind's marker file, and weight
  /// components their weights (find_component_weights): for FluxPipeline config.json and weights
  /// for transformer, vae, text_encoder and text_encoder_2, tokenizer_config.json for the
  /// tokenizers, scheduler_config.json for the scheduler. Throws naming the folder, the component
  /// and what was expected.
  static PipelineFolder open(const std::string& root, const std::vector<std::string>& required_components,
                             const std::map<std::string, ComponentOverride>& overrides = {},
                             const PipelineLayout& layout = flux_pipeline_layout());

  /// The directory of `name`; throws naming the folder when it was not resolved.
  const std::string& directory(const std::string& name) const;
};

/// model_index.json's `_class_name` of the pipeline folder `root` ("FluxPipeline"): which model
/// family's pipeline it is. Throws naming the file when there is none or it is malformed.
REMAT_API std::string pipeline_class(const std::string& root);

/// Whether `dir` is a pipeline folder (holds model_index.json).
REMAT_API bool is_pipeline_folder(const std::string& dir);
/// Whether `dir` is a component folder (holds config.json).
REMAT_API bool is_component_folder(const std::string& dir);

/// Resolves a component directory from a user-given path: a pipeline folder (validated by
/// PipelineFolder::open with `component` required and `override`), or a component folder alone.
/// Throws naming the path when it is neither.
REMAT_API std::string resolve_component_directory(const std::string& path, const std::string& component,
                                                  const std::optional<ComponentOverride>& override = {},
                                                  const PipelineLayout& layout = flux_pipeline_layout());

}  // namespace remat::encoders
