// The weights of one component directory of a diffusers pipeline folder: finding them by the
// diffusers / transformers file conventions, checking a shard index against its shards, loading
// them strictly into a module, and writing them (sharded like the hub's writers).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <unordered_map>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "json_file.h"
#include "string_helpers.h"
#include "remat/models/component_weights.h"
#include "remat/models/quantized_loading.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"

namespace remat::models {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const char* const kBases[] = {"diffusion_pytorch_model", "model"};

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// Files in `dir` that are a weight convention we refuse to read, for the "no weights" message:
// variants (`<base>.<variant>.safetensors`, `<base>.safetensors.index.<variant>.json`, variant
// shards) and pickled `.bin` files.
std::vector<std::string> refused_weight_files(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    for (const std::string base : kBases) {
      if (name.rfind(base + ".", 0) != 0 && name.rfind(base + "-", 0) != 0) continue;
      const bool plain = name == base + ".safetensors" || name == base + ".safetensors.index.json";
      const bool shard = name.rfind(base + "-", 0) == 0 && name.find(".safetensors") != std::string::npos &&
                         name.find(".", base.size()) == name.find(".safetensors");
      if (!plain && !shard) out.push_back(name);
      break;
    }
    if (name == "pytorch_model.bin" || name == "pytorch_model.bin.index.json") out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

using remat::detail::join;

// Reads `<base>.safetensors.index.json` into weight_map, checking its shape: an object with a
// `weight_map` object whose values are plain file names (no directory part: a shard outside the
// component directory would let an index read any file).
std::map<std::string, std::string> read_index(const std::string& path) {
  const Json j = remat::detail::read_json_file(path, "pipeline", "shard index");
  if (!j.is_object()) {
    throw_value_error("[pipeline] shard index '" + path + "' must be a JSON object, got " + util::json_excerpt(j));
  }
  const auto it = j.find("weight_map");
  if (it == j.end() || !it->is_object()) {
    throw_value_error("[pipeline] shard index '" + path +
                      "' must have a \"weight_map\" object (tensor key -> shard file name)" +
                      (it == j.end() ? std::string(", but has none") : ", got " + util::json_excerpt(*it)));
  }
  if (it->empty()) throw_value_error("[pipeline] shard index '" + path + "' has an empty weight_map");
  std::map<std::string, std::string> out;
  for (auto entry = it->begin(); entry != it->end(); ++entry) {
    const std::string key = entry.key();
    if (!entry->is_string()) {
      throw_value_error("[pipeline] shard index '" + path + "': weight_map['" + util::text_excerpt(key) +
                        "'] must be a shard file name (a string), got " + util::json_excerpt(*entry));
    }
    const std::string file = entry->get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\\') != std::string::npos || file.find('\0') != std::string::npos) {
      throw_value_error("[pipeline] shard index '" + path + "': weight_map['" + util::text_excerpt(key) +
                        "'] must be a file name in the same directory, got '" + util::text_excerpt(file) + "'");
    }
    out.emplace(key, file);
  }
  return out;
}

std::string weights_file_name(const std::string& base, const std::string& variant) {
  return variant.empty() ? base + ".safetensors" : base + "." + variant + ".safetensors";
}

std::string index_file_name(const std::string& base, const std::string& variant) {
  return variant.empty() ? base + ".safetensors.index.json" : base + ".safetensors.index." + variant + ".json";
}

}  // namespace

void check_weights_variant(const std::string& variant) {
  const bool ok = !variant.empty() && variant.size() <= 64 &&
                  std::all_of(variant.begin(), variant.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
                  });
  if (!ok) {
    throw_value_error("[pipeline] variant must be a name such as fp16, bf16 or non_ema (letters, digits, '_' and "
                      "'-', at most 64), got '" + util::text_excerpt(variant) + "'");
  }
}

ComponentWeights find_component_weights(const std::string& component_dir, const std::string& variant) {
  if (!variant.empty()) check_weights_variant(variant);
  const fs::path dir(component_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw_value_error("[pipeline] component directory '" + component_dir + "' does not exist or is not a directory");
  }
  std::vector<std::pair<std::string, bool>> found;  // (base, sharded)
  for (const std::string base : kBases) {
    // diffusers' from_pretrained: an index, when present, wins over a whole file of the same base.
    if (is_file(dir / index_file_name(base, variant))) {
      found.emplace_back(base, true);
    } else if (is_file(dir / weights_file_name(base, variant))) {
      found.emplace_back(base, false);
    }
  }
  if (found.empty()) {
    const auto refused = refused_weight_files(dir);
    std::vector<std::string> plain;  // the plain files, when a variant was asked for
    for (const std::string base : kBases) {
      for (const auto& name : {index_file_name(base, ""), weights_file_name(base, "")}) {
        if (!variant.empty() && is_file(dir / name)) plain.push_back(name);
      }
    }
    const std::string expected =
        variant.empty()
            ? "diffusion_pytorch_model.safetensors, model.safetensors, or a shard index "
              "diffusion_pytorch_model.safetensors.index.json / model.safetensors.index.json"
            : "the '" + variant + "' variant (diffusers' and transformers' names: " +
                  weights_file_name("diffusion_pytorch_model", variant) + ", " + weights_file_name("model", variant) +
                  ", or a shard index " + index_file_name("diffusion_pytorch_model", variant) + " / " +
                  index_file_name("model", variant) + ")";
    std::vector<std::string> present = plain;
    present.insert(present.end(), refused.begin(), refused.end());
    throw_value_error(
        "[pipeline] no weights in '" + component_dir + "': expected " + expected +
        (present.empty() ? std::string()
                         : "; found only " + join(present) +
                               (variant.empty() ? " (pickled *.bin files are not read; a variant's files such as "
                                                  "*.fp16.safetensors are read with variant set to its name)"
                                                : "")));
  }
  if (found.size() > 1) {
    std::vector<std::string> names;
    for (const auto& [base, sharded] : found) {
      names.push_back(sharded ? index_file_name(base, variant) : weights_file_name(base, variant));
    }
    throw_value_error("[pipeline] '" + component_dir + "' holds more than one set of weights (" + join(names) +
                      "): expected exactly one, so which one is meant is not guessed");
  }
  ComponentWeights out;
  out.directory = component_dir;
  out.base = found.front().first;
  if (!found.front().second) {
    out.files.push_back((dir / weights_file_name(out.base, variant)).string());
    return out;
  }
  out.index = (dir / index_file_name(out.base, variant)).string();
  out.weight_map = read_index(*out.index);
  std::set<std::string> shards;
  for (const auto& [key, file] : out.weight_map) shards.insert(file);
  for (const auto& file : shards) out.files.push_back((dir / file).string());
  return out;
}

std::vector<io::SafetensorsFile> open_component_weights(const std::string& component_dir, const std::string& variant) {
  const ComponentWeights weights = find_component_weights(component_dir, variant);
  std::vector<io::SafetensorsFile> files;
  if (!weights.index) {
    files.push_back(io::SafetensorsFile::open(weights.files.front()));
    return files;
  }
  const std::string& index = *weights.index;
  // The first key the index maps to each shard, to name in a "shard missing" message.
  std::map<std::string, std::string> first_key;
  for (const auto& [key, file] : weights.weight_map) first_key.emplace(file, key);
  // Every shard must exist before any is read: a missing file is the first thing to report.
  for (const auto& path : weights.files) {
    const std::string file = fs::path(path).filename().string();
    if (!is_file(path)) {
      throw_value_error("[pipeline] shard index '" + index + "' maps key '" + first_key.at(file) +
                        "' to shard '" + file + "', which does not exist in '" + component_dir + "'");
    }
  }
  for (const auto& path : weights.files) {
    const std::string file = fs::path(path).filename().string();
    files.push_back(io::SafetensorsFile::open(path));
    const io::SafetensorsFile& shard = files.back();
    for (const auto& key : shard.names()) {
      const auto it = weights.weight_map.find(key);
      if (it == weights.weight_map.end()) {
        throw_value_error("[pipeline] shard '" + path + "' holds key '" + key + "', which the index '" + index +
                          "' does not list");
      }
      if (it->second != file) {
        throw_value_error("[pipeline] shard '" + path + "' holds key '" + key + "', which the index '" + index +
                          "' maps to shard '" + it->second + "'");
      }
    }
  }
  for (const auto& [key, file] : weights.weight_map) {
    const auto& shard = files[static_cast<size_t>(
        std::distance(weights.files.begin(),
                      std::find(weights.files.begin(), weights.files.end(), (fs::path(component_dir) / file).string())))];
    if (!shard.contains(key)) {
      throw_value_error("[pipeline] shard index '" + index + "' maps key '" + key + "' to shard '" + file +
                        "', but '" + shard.path() + "' has no such tensor");
    }
  }
  return files;
}

io::LoadReport load_component(const std::string& component_dir, torch::nn::Module& module,
                              const io::LoadOptions& options, const std::string& variant) {
  const auto files = open_component_weights(component_dir, variant);
  const auto awaiting = models::awaiting_weight_keys(module);
  if (!awaiting.empty()) {
    // A model built to be quantised (remat/models/quantized_loading.h): its waiting Linears are
    // quantised as the shards stream by; strict, as the default load.
    if (!options.strict || options.key_filter || !options.strip_prefix.empty() || !options.add_prefix.empty()) {
      throw_value_error("[pipeline] " + component_dir + ": a model with quantised base weights loads strictly, "
                        "without key filters or prefixes");
    }
    models::load_state_dict_quantizing(module, files);
    io::LoadReport report;
    for (const auto& entry : io::module_state(module)) report.loaded.push_back(entry.first);
    report.loaded.insert(report.loaded.end(), awaiting.begin(), awaiting.end());
    std::sort(report.loaded.begin(), report.loaded.end());
    return report;
  }
  if (options.strict) {
    // load_state_dict_into's strict error lists the keys for all files together; this check
    // comes first so that each problem names the one file that holds the key.
    std::unordered_map<std::string, std::vector<int64_t>> targets;
    for (const auto& [name, tensor] : io::module_state(module)) targets.emplace(name, tensor.sizes().vec());
    std::set<std::string> provided;
    std::vector<std::string> problems;
    for (const auto& file : files) {
      for (const auto& file_key : file.names()) {
        if (options.key_filter && !options.key_filter(file_key)) continue;
        std::string key = file_key;
        if (!options.strip_prefix.empty()) {
          if (key.compare(0, options.strip_prefix.size(), options.strip_prefix) != 0) {
            problems.push_back("unexpected key '" + file_key + "' in '" + file.path() + "' (does not start with '" +
                               options.strip_prefix + "')");
            continue;
          }
          key.erase(0, options.strip_prefix.size());
        }
        key = options.add_prefix + key;
        provided.insert(key);
        const auto target = targets.find(key);
        if (target == targets.end()) {
          problems.push_back("unexpected key '" + file_key + "' in '" + file.path() + "' (the module has no such tensor)");
          continue;
        }
        const auto& shape = file.info(file_key).shape;
        if (shape != target->second) {
          std::ostringstream msg;
          msg << "shape mismatch for key '" << file_key << "' in '" << file.path() << "': file "
              << c10::IntArrayRef(shape) << ", module " << c10::IntArrayRef(target->second);
          problems.push_back(msg.str());
        }
      }
    }
    std::vector<std::string> missing;
    for (const auto& [key, shape] : targets) {
      if (provided.count(key) == 0) missing.push_back(key);
    }
    std::sort(missing.begin(), missing.end());
    for (const auto& key : missing) {
      problems.push_back("missing key '" + key + "' (in the module, in none of the weight files of '" +
                         component_dir + "')");
    }
    if (!problems.empty()) {
      throw_value_error("[pipeline] cannot load '" + component_dir + "' into the module (strict): " +
                        std::to_string(problems.size()) + " problem(s)\n  " + join(problems, "\n  "));
    }
  }
  return io::load_state_dict_into(module, files, options);
}

void save_component(const std::string& component_dir, const torch::nn::Module& module,
                    const std::string& config_json_text, uint64_t max_shard_bytes, const std::string& base) {
  if (base != kBases[0] && base != kBases[1]) {
    throw_value_error("[pipeline] weight base name must be diffusion_pytorch_model or model, got '" + base + "'");
  }
  if (max_shard_bytes == 0) throw_value_error("[pipeline] max_shard_bytes must be > 0");
  util::check_json_text(config_json_text, util::kMaxJsonFileBytes, "[pipeline] config.json for '" + component_dir + "'");
  const Json config = Json::parse(config_json_text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) {
    throw_value_error("[pipeline] config.json for '" + component_dir + "' must be a JSON object");
  }
  const fs::path dir(component_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw_value_error("[pipeline] cannot create component directory '" + component_dir + "': " + ec.message());
  }

  // huggingface_hub's split_torch_state_dict_into_shards: in state-dict order, start a new shard
  // when the next tensor would pass the limit; a tensor over the limit alone gets its own shard.
  const std::vector<io::NamedTensor> state = io::module_state(module);
  std::vector<std::vector<io::NamedTensor>> shards;
  std::vector<io::NamedTensor> current;
  uint64_t current_bytes = 0, total_bytes = 0;
  for (const auto& entry : state) {
    const uint64_t bytes = static_cast<uint64_t>(entry.second.numel()) * entry.second.element_size();
    total_bytes += bytes;
    if (bytes > max_shard_bytes) {
      shards.push_back({entry});
      continue;
    }
    if (!current.empty() && current_bytes + bytes > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(entry);
    current_bytes += bytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

  const fs::path single = dir / (base + ".safetensors");
  const fs::path index = dir / (base + ".safetensors.index.json");
  util::write_file_atomically((dir / "config.json").string(), config.dump(2) + "\n", "pipeline");
  if (shards.size() == 1) {
    io::save_safetensors(single.string(), shards.front(), {{"format", "pt"}});
    fs::remove(index, ec);
    return;
  }
  char name[64];
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(name, sizeof(name), "-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    const std::string file = base + name;
    io::save_safetensors((dir / file).string(), shards[i], {{"format", "pt"}});
    for (const auto& [key, tensor] : shards[i]) weight_map[key] = file;
  }
  Json index_json = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  // The index goes last: a reader never sees an index naming a shard not yet written.
  util::write_file_atomically(index.string(), index_json.dump(2) + "\n", "pipeline");
  fs::remove(single, ec);
}

}  // namespace remat::models
