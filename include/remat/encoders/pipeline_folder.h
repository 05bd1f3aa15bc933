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
#include "remat/models/component_weights.h"

namespace remat::encoders {

/// One kind of component a pipeline folder can hold, as model_index.json names it.
struct ComponentKind {
  std::string name;                  ///< its key and directory ("vae")
  std::string library;               ///< "diffusers" or "transformers"
  std::vector<std::string> classes;  ///< the classes accepted ("AutoencoderKL")
  std::string marker;                ///< the file that marks its directory complete ("config.json")
  bool weights = false;              ///< it has safetensors weights (find_component_weights)
  /// A model_index.json key whose string value, when present, says where the component is instead
  /// of `<root>/<name>`: a path relative to the folder (it may not leave it) or absolute, naming
  /// the component's directory or a file in it (Mage-Flow's `_vae_source`, `_text_encoder_path`,
  /// read by SimpleTuner's vendored load_from_repo). The component then needs no [library, class]
  /// entry. Empty: none.
  std::string source_key = {};
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
  /// The weights variant read from every component (models::find_component_weights); empty: the
  /// plain files.
  std::string variant;
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
  /// tokenizers, scheduler_config.json for the scheduler. With `variant`, weight components need
  /// that variant's files. Throws naming the folder, the component and what was expected.
  static PipelineFolder open(const std::string& root, const std::vector<std::string>& required_components,
                             const std::map<std::string, ComponentOverride>& overrides = {},
                             const PipelineLayout& layout = flux_pipeline_layout(), const std::string& variant = {});

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
/// PipelineFolder::open with `component` required and `override`), or a component folder alone;
/// its weights of `variant` when given. Throws naming the path when it is neither.
REMAT_API std::string resolve_component_directory(const std::string& path, const std::string& component,
                                                  const std::optional<ComponentOverride>& override = {},
                                                  const PipelineLayout& layout = flux_pipeline_layout(),
                                                  const std::string& variant = {});

}  // namespace remat::encoders
