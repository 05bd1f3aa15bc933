// The LoRAs of a sampling run: `--lora PATH[:SCALE]`, and each file read and checked against the
// transformer's shapes before any model is built (remat/sample/pipeline.h).

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <c10/util/StringUtil.h>

#include "remat/io/hub_cache.h"
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

// diffusers' _best_guess_weight_name (loaders/lora_base.py): the folder's top-level .safetensors
// files without "scheduler", "optimizer" or "checkpoint" in their names; pytorch_lora_weights.
// safetensors when present. Where diffusers takes the first of several with a warning, this names
// them all and asks for one.
std::string lora_file_of(const std::string& path_or_id, const std::string& revision, std::string* resolved_from) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string dir = path_or_id;
  if (!fs::is_directory(path_or_id, ec)) {
    const auto snapshot = io::hub_snapshot_unless_local(path_or_id, revision, {}, "sample");
    if (!snapshot) return path_or_id;  // a file (or nothing: read_loras_for names it)
    dir = snapshot->directory;
    if (resolved_from) {
      *resolved_from = path_or_id + " at revision " + revision + " (commit " + snapshot->commit +
                       ") from the Hugging Face cache: " + snapshot->directory;
    }
  }
  std::vector<std::string> candidates;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool weights = name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0;
    const bool excluded = name.find("scheduler") != std::string::npos ||
                          name.find("optimizer") != std::string::npos || name.find("checkpoint") != std::string::npos;
    if (weights && !excluded) candidates.push_back(name);
  }
  std::sort(candidates.begin(), candidates.end());
  const std::string standard = "pytorch_lora_weights.safetensors";
  if (std::find(candidates.begin(), candidates.end(), standard) != candidates.end()) {
    return (fs::path(dir) / standard).string();
  }
  if (candidates.size() == 1) return (fs::path(dir) / candidates.front()).string();
  if (candidates.empty()) {
    throw_value_error("[sample] --lora '" + path_or_id + "': " + dir + " holds no .safetensors LoRA file (" + standard +
                      " or another top-level .safetensors)");
  }
  std::string names;
  for (const auto& c : candidates) names += (names.empty() ? "" : ", ") + c;
  throw_value_error("[sample] --lora '" + path_or_id + "': " + dir + " holds several .safetensors files (" + names +
                    "): name one, e.g. --lora " + (fs::path(dir) / candidates.front()).string());
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
