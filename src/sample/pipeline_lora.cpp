// The LoRAs of a sampling run: `--lora PATH[:SCALE]`, and each file read and checked against the
// transformer's shapes before any model is built (remat/sample/pipeline.h).

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <c10/util/StringUtil.h>

#include "remat/util/error.h"
#include "remat/util/files.h"
#include "remat/models/lora.h"
#include "remat/sample/pipeline.h"

namespace remat::sample {
namespace {

// The whole text as a finite number, or nothing.
std::optional<double> parse_number(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(value)) return std::nullopt;
  return value;
}

}  // namespace

LoraSpec parse_lora_spec(const std::string& text) {
  LoraSpec spec;
  spec.path = text;
  // A path may hold ':' itself (C:\..., name:v2.safetensors): only a trailing number is a scale.
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos) {
    if (const auto scale = parse_number(text.substr(colon + 1))) {
      spec.path = text.substr(0, colon);
      spec.scale = *scale;
    }
  }
  if (spec.path.empty()) {
    throw_value_error("[sample] --lora needs a file: PATH or PATH:SCALE, got '" + text + "'");
  }
  return spec;
}

std::vector<models::LoraFile> read_loras_for(const std::vector<LoraSpec>& loras,
                                            const std::vector<models::LinearShape>& linear_layers) {
  std::map<std::string, models::LinearShape> layers;
  for (const auto& layer : linear_layers) layers[layer.name] = layer;
  std::vector<models::LoraFile> files;
  for (const auto& spec : loras) {
    util::require_regular_file(spec.path, "sample", "a LoRA file");
    models::LoraFile file = models::read_lora_file(spec.path);
    // The same test merge_lora makes on the built model, from the config alone, so a LoRA for
    // another model fails before the text encoders and the transformer are loaded.
    for (const auto& [name, w] : file.modules) {
      const auto it = layers.find(name);
      if (it == layers.end()) {
        throw_value_error("[sample] LoRA '" + spec.path + "' (" + models::lora_format_name(file.format) +
                          ") adapts " + name + ", which this transformer does not have (a LoRA for another model)");
      }
      const auto& layer = it->second;
      const bool fits = w.down.dim() == 2 && w.up.dim() == 2 && w.down.size(0) == w.up.size(1) &&
                        w.down.size(1) == layer.in_features && w.up.size(0) == layer.out_features;
      if (!fits) {
        throw_value_error("[sample] LoRA '" + spec.path + "' does not fit this transformer (a LoRA for another model "
                          "shape): " + name + " has weight [" + std::to_string(layer.out_features) + ", " +
                          std::to_string(layer.in_features) + "] but the LoRA factors are down " +
                          c10::str(w.down.sizes()) + " and up " + c10::str(w.up.sizes()));
      }
    }
    files.push_back(std::move(file));
  }
  return files;
}

}  // namespace remat::sample
