// pretrained_model_name_or_path and SimpleTuner's per-component overrides, resolved to the
// transformer's weights and config.json.
#include "remat/train/family/model_source.h"

#include <filesystem>

#include "remat/encoders/pipeline_folder.h"
#include "remat/util/error.h"
#include "remat/util/files.h"
#include "remat/train/family/family.h"

namespace remat::train {
namespace {

namespace fs = std::filesystem;

bool is_dir(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

std::string config_of(const std::string& component_dir) { return (fs::path(component_dir) / "config.json").string(); }

bool is_safetensors_name(const std::string& p) {
  const std::string suffix = ".safetensors";
  return p.size() > suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string ModelSource::describe() const {
  if (!weights) return "transformer: random initialisation";
  std::string out = "transformer: " + *weights;
  if (pipeline_folder) out += " (pipeline folder " + *pipeline_folder + ")";
  if (config_json) out += ", config " + *config_json;
  if (vae_directory) out += "; VAE folder " + *vae_directory + " (checked, not loaded: latents come from the cache)";
  if (!vae_note.empty()) out += "; " + vae_note;
  return out;
}

ModelSource resolve_model_source(const TrainConfig& config) {
  // The family's pipeline folders: their model_index.json class and components.
  const encoders::PipelineLayout& layout = model_family(config.model_family).encoders.layout;
  const std::string variant = config.variant.value_or("");  // every component's weights
  std::map<std::string, encoders::ComponentOverride> overrides;
  // SimpleTuner loads a transformer override ending in .safetensors with from_single_file (a
  // diffusers- or Black Forest Labs-layout file), taking the config from the pipeline folder.
  std::optional<std::string> transformer_file;
  if (config.pretrained_transformer_model_name_or_path &&
      is_safetensors_name(*config.pretrained_transformer_model_name_or_path)) {
    if (config.pretrained_transformer_subfolder) {
      throw_value_error("[train] pretrained_transformer_subfolder ('" + *config.pretrained_transformer_subfolder +
                        "') cannot apply to pretrained_transformer_model_name_or_path '" +
                        *config.pretrained_transformer_model_name_or_path + "', a single .safetensors file");
    }
    util::require_regular_file(*config.pretrained_transformer_model_name_or_path, "train",
                             "pretrained_transformer_model_name_or_path");
    transformer_file = *config.pretrained_transformer_model_name_or_path;
  } else if (config.pretrained_transformer_model_name_or_path) {
    overrides["transformer"] = {*config.pretrained_transformer_model_name_or_path,
                                config.pretrained_transformer_subfolder};
  } else if (config.pretrained_transformer_subfolder) {
    throw_value_error("[train] pretrained_transformer_subfolder ('" + *config.pretrained_transformer_subfolder +
                      "') needs pretrained_transformer_model_name_or_path (the folder it is a subfolder of)");
  }
  ModelSource source;
  if (config.pretrained_vae_model_name_or_path) {
    // Training reads VAE latents from the cache, so the VAE is only checked, and only when it is a
    // local folder: SimpleTuner configs often name a hub repository here, which must not stop a
    // run that never needs it.
    if (is_dir(*config.pretrained_vae_model_name_or_path)) {
      overrides["vae"] = {*config.pretrained_vae_model_name_or_path, std::nullopt};
    } else {
      source.vae_note = "VAE '" + *config.pretrained_vae_model_name_or_path +
                        "' not read (not a local folder; training uses the latent cache)";
    }
  }

  const auto& path = config.pretrained_model_name_or_path;
  std::optional<std::string> transformer_dir;
  if (path && encoders::is_pipeline_folder(*path)) {
    // The folder is validated with every override in place (a broken override fails here too).
    const auto folder = encoders::PipelineFolder::open(
        *path, transformer_file ? std::vector<std::string>{} : std::vector<std::string>{"transformer"}, overrides,
        layout, variant);
    if (folder.components.count("transformer")) transformer_dir = folder.directory("transformer");
    if (folder.components.count("vae")) source.vae_directory = folder.directory("vae");
    source.pipeline_folder = *path;
  } else {
    if (overrides.count("transformer")) {
      // The override names the transformer; pretrained_model_name_or_path (if set) is not read.
      transformer_dir = encoders::resolve_component_directory(overrides["transformer"].path, "transformer",
                                                               overrides["transformer"], layout, variant);
    } else if (transformer_file) {
      // The file is the transformer; pretrained_model_name_or_path (if set) is not read for it.
    } else if (path && is_dir(*path)) {
      if (!encoders::is_component_folder(*path)) {
        throw_value_error("[train] pretrained_model_name_or_path '" + *path +
                          "' is a directory but neither a diffusers pipeline folder (model_index.json) nor a "
                          "transformer folder (config.json with diffusion_pytorch_model.safetensors or its "
                          "shard index)");
      }
      transformer_dir = encoders::resolve_component_directory(*path, "transformer", std::nullopt, layout, variant);
    } else if (path) {
      std::error_code ec;
      if (!fs::exists(*path, ec)) {
        throw_value_error("[train] pretrained_model_name_or_path '" + *path +
                          "' does not exist (expected a diffusers pipeline folder, a transformer folder or a "
                          ".safetensors file)");
      }
      util::require_regular_file(*path, "train", "pretrained_model_name_or_path");
      source.weights = *path;
    }
    if (overrides.count("vae")) {
      source.vae_directory =
          encoders::resolve_component_directory(overrides["vae"].path, "vae", overrides["vae"], layout, variant);
    }
  }
  if (transformer_file) {
    source.weights = *transformer_file;
    // The pipeline's transformer config.json when there is one (as SimpleTuner does); otherwise
    // a BFL file's shapes, or the flavour's preset for a diffusers-layout file.
    if (transformer_dir && fs::exists(config_of(*transformer_dir))) source.config_json = config_of(*transformer_dir);
  } else if (transformer_dir) {
    source.weights = *transformer_dir;
    source.config_json = config_of(*transformer_dir);
  }
  // An explicit config.json wins over the folder's (it is the option that overrides shapes).
  if (config.pretrained_transformer_config) source.config_json = *config.pretrained_transformer_config;
  return source;
}

TransformerSpec transformer_spec_of(const TrainConfig& config, const ModelSource& source) {
  TransformerSpec spec;
  spec.family = config.model_family;
  spec.flavour = config.model_flavour;
  spec.config_json = source.config_json;
  spec.weights = source.weights;
  spec.variant = config.variant.value_or("");
  return spec;
}

}  // namespace remat::train
