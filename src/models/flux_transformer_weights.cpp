// A Flux transformer from a .safetensors file or a component folder, in either weight layout.
#include "remat/models/flux_transformer_weights.h"

#include <filesystem>

#include "remat/models/component_weights.h"
#include "remat/models/flux_weight_formats.h"

namespace remat::models {
namespace {

bool is_directory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

}  // namespace

void load_flux_transformer_weights(models::FluxImpl& model, const std::string& file_or_component_dir,
                                   const std::string& variant) {
  if (is_directory(file_or_component_dir)) {
    // The folder's files (one, or shards checked against their index), in whichever layout.
    const auto files = open_component_weights(file_or_component_dir, variant);
    std::vector<std::string> keys;
    for (const auto& f : files) keys.insert(keys.end(), f.names().begin(), f.names().end());
    if (models::detect_flux_weight_layout(keys).layout == models::FluxWeightLayout::diffusers) {
      load_component(file_or_component_dir, model, {}, variant);  // strict, naming each key's file
    } else {
      models::load_flux_weights(model, files);
    }
    return;
  }
  models::load_flux_weights(model, file_or_component_dir);
}

std::optional<models::FluxConfig> flux_config_for_weights(const std::string& file_or_component_dir) {
  if (is_directory(file_or_component_dir)) {
    return models::FluxConfig::from_json_file((std::filesystem::path(file_or_component_dir) / "config.json").string());
  }
  if (!models::is_bfl_flux_file(file_or_component_dir)) return std::nullopt;
  return models::flux_config_from_bfl(io::SafetensorsFile::open(file_or_component_dir));
}

}  // namespace remat::models
