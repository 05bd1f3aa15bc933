// A diffusers Flux pipeline folder: model_index.json, and where each component's directory is
// (its own subfolder, or an override) with the files that component needs.
#include "json_file.h"
#include "remat/encoders/pipeline_folder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "string_helpers.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"

namespace remat::encoders {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const ComponentKind* kind_of(const PipelineLayout& layout, const std::string& name) {
  for (const auto& k : layout.components) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

// "a FluxPipeline has scheduler, text_encoder, ...": what an unknown component name is told.
std::string components_of(const PipelineLayout& layout) {
  std::vector<std::string> names;
  for (const auto& k : layout.components) names.push_back(k.name);
  return (layout.pipeline_classes.empty() ? std::string("this model family reads") : "a " + layout.pipeline_classes.front() + " has") +
         " " + remat::detail::join(names);
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

using remat::detail::join;

using remat::detail::lower;

Json read_model_index(const std::string& path) {
  const Json j = remat::detail::read_json_file(path, "pipeline", "model_index.json");
  if (!j.is_object()) throw_value_error("[pipeline] '" + path + "' must be a JSON object, got " + util::json_excerpt(j));
  const auto cls = j.find("_class_name");
  if (cls == j.end() || !cls->is_string()) {
    throw_value_error("[pipeline] '" + path + "': _class_name must be the pipeline's class (a string, such as "
                      "\"FluxPipeline\"), got " + (cls == j.end() ? std::string("none") : util::json_excerpt(*cls)));
  }
  return j;
}

Json read_model_index(const std::string& path, const PipelineLayout& layout) {
  Json j = read_model_index(path);
  const std::string cls = j["_class_name"].get<std::string>();
  if (std::find(layout.pipeline_classes.begin(), layout.pipeline_classes.end(), cls) == layout.pipeline_classes.end()) {
    throw_value_error("[pipeline] '" + path + "': _class_name must be " +
                      (layout.pipeline_classes.size() == 1 ? "\"" + layout.pipeline_classes.front() + "\""
                                                           : "one of " + join(layout.pipeline_classes)) +
                      " (" + layout.reads + "), got " + util::json_excerpt(j["_class_name"]));
  }
  return j;
}

// Checks that `dir` holds what component `kind` needs; `what` says where the directory came from.
void check_component_directory(const ComponentKind& kind, const std::string& dir, const std::string& what,
                               const std::string& variant = {}) {
  if (!is_dir(dir)) {
    throw_value_error("[pipeline] " + what + ": component '" + kind.name + "' needs the directory '" + dir +
                      "' (with " + kind.marker + (kind.weights ? " and its safetensors weights" : "") +
                      "), which does not exist");
  }
  if (!is_file(fs::path(dir) / kind.marker)) {
    throw_value_error("[pipeline] " + what + ": component '" + kind.name + "' directory '" + dir + "' has no " +
                      kind.marker);
  }
  if (kind.weights) models::find_component_weights(dir, variant);  // throws naming the directory
}

// The directory an override names for `component`.
std::string override_directory(const PipelineLayout& layout, const std::string& component,
                               const ComponentOverride& o) {
  if (o.path.empty()) throw_value_error("[pipeline] the override for component '" + component + "' has an empty path");
  if (!is_dir(o.path)) {
    throw_value_error("[pipeline] the override for component '" + component + "' must be a directory (a pipeline "
                      "folder or a '" + component + "' folder), got '" + o.path + "'");
  }
  if (o.subfolder) {
    const std::string sub = *o.subfolder;
    if (sub.empty() || lower(sub) == "none") return o.path;
    return (fs::path(o.path) / sub).string();
  }
  const ComponentKind* kind = kind_of(layout, component);
  const std::string marker = kind != nullptr ? kind->marker : "config.json";
  return is_file(fs::path(o.path) / marker) ? o.path : (fs::path(o.path) / component).string();
}

// The directory model_index.json's `kind.source_key` names, if it has one: a path relative to the
// folder (lexically inside it, as SimpleTuner's vendored _safe_subpath requires) or absolute; a
// file names its directory.
std::optional<std::string> source_directory(const ComponentKind& kind, const Json& index, const std::string& root,
                                            const std::string& index_path) {
  if (kind.source_key.empty()) return std::nullopt;
  const auto it = index.find(kind.source_key);
  if (it == index.end() || it->is_null()) return std::nullopt;
  if (!it->is_string() || it->get<std::string>().empty()) {
    throw_value_error("[pipeline] '" + index_path + "': " + kind.source_key + " must be a path (a non-empty string) to "
                      "the '" + kind.name + "' component, got " + util::json_excerpt(*it));
  }
  const fs::path given(it->get<std::string>());
  fs::path path = given;
  if (given.is_relative()) {
    const fs::path base = fs::path(root).lexically_normal();
    path = (base / given).lexically_normal();
    const auto rel = path.lexically_relative(base);
    if (rel.empty() || *rel.begin() == "..") {
      throw_value_error("[pipeline] '" + index_path + "': " + kind.source_key + " '" + util::text_excerpt(given.string()) +
                        "' leaves the pipeline folder; give a path inside it or an absolute one");
    }
  }
  return (is_file(path) ? path.parent_path() : path).string();
}

}  // namespace

const PipelineLayout& flux_pipeline_layout() {
  static const PipelineLayout layout = {
      {"FluxPipeline", "FluxKontextPipeline"},
      "remat reads Flux pipeline folders",
      {
          {"scheduler", "diffusers", {"FlowMatchEulerDiscreteScheduler"}, "scheduler_config.json", false},
          {"text_encoder", "transformers", {"CLIPTextModel"}, "config.json", true},
          {"text_encoder_2", "transformers", {"T5EncoderModel"}, "config.json", true},
          // The slow and the fast tokenizer classes read the same folder for these two.
          {"tokenizer", "transformers", {"CLIPTokenizer", "CLIPTokenizerFast"}, "tokenizer_config.json", false},
          {"tokenizer_2", "transformers", {"T5TokenizerFast", "T5Tokenizer"}, "tokenizer_config.json", false},
          {"transformer", "diffusers", {"FluxTransformer2DModel"}, "config.json", true},
          {"vae", "diffusers", {"AutoencoderKL"}, "config.json", true},
      }};
  return layout;
}

const std::vector<std::string>& flux_pipeline_components() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& k : flux_pipeline_layout().components) out.push_back(k.name);
    return out;
  }();
  return names;
}

std::string pipeline_class(const std::string& root) {
  const std::string index_path = (fs::path(root) / "model_index.json").string();
  if (!is_file(index_path)) {
    throw_value_error("[pipeline] '" + root + "' is not a diffusers pipeline folder: it has no model_index.json");
  }
  return read_model_index(index_path)["_class_name"].get<std::string>();
}

bool is_pipeline_folder(const std::string& dir) { return is_file(fs::path(dir) / "model_index.json"); }
bool is_component_folder(const std::string& dir) { return is_file(fs::path(dir) / "config.json"); }

PipelineFolder PipelineFolder::open(const std::string& root, const std::vector<std::string>& required_components,
                                    const std::map<std::string, ComponentOverride>& overrides,
                                    const PipelineLayout& layout, const std::string& variant) {
  if (layout.pipeline_classes.empty()) {
    throw_value_error("[pipeline] cannot open '" + root + "': the model family reads no pipeline folders (its "
                      "PipelineLayout names no pipeline class)");
  }
  if (!is_dir(root)) throw_value_error("[pipeline] pipeline folder '" + root + "' does not exist or is not a directory");
  const std::string index_path = (fs::path(root) / "model_index.json").string();
  if (!is_file(index_path)) {
    throw_value_error("[pipeline] '" + root + "' is not a diffusers pipeline folder: it has no model_index.json");
  }
  for (const auto& name : required_components) {
    if (kind_of(layout, name) == nullptr) {
      throw_value_error("[pipeline] unknown component '" + name + "'; " + components_of(layout));
    }
  }
  for (const auto& [name, o] : overrides) {
    if (kind_of(layout, name) == nullptr) {
      throw_value_error("[pipeline] cannot override unknown component '" + name + "'; " + components_of(layout));
    }
  }
  const Json index = read_model_index(index_path, layout);

  PipelineFolder folder;
  folder.root = root;
  folder.variant = variant;
  if (const auto v = index.find("_diffusers_version"); v != index.end() && v->is_string()) {
    folder.diffusers_version = v->get<std::string>();
  }
  // Every component entry: [library, class] strings, or [null, null] for an absent optional one.
  std::map<std::string, std::pair<std::string, std::string>> named;
  for (auto it = index.begin(); it != index.end(); ++it) {
    if (it.key().empty() || it.key()[0] == '_') continue;
    const Json& v = *it;
    const bool pair = v.is_array() && v.size() == 2;
    if (pair && v[0].is_null() && v[1].is_null()) continue;
    if (!pair || !v[0].is_string() || !v[1].is_string()) {
      throw_value_error("[pipeline] '" + index_path + "': component '" + util::text_excerpt(it.key()) +
                        "' must be [library, class] (two strings) or [null, null], got " + util::json_excerpt(v));
    }
    named[it.key()] = {v[0].get<std::string>(), v[1].get<std::string>()};
  }

  const auto wanted = [&](const std::string& name) {
    return std::find(required_components.begin(), required_components.end(), name) != required_components.end();
  };
  for (const auto& kind : layout.components) {
    const std::string name = kind.name;
    const bool required = wanted(name);
    const auto o = overrides.find(name);
    PipelineComponent c;
    c.name = name;
    if (o != overrides.end()) {
      c.directory = override_directory(layout, name, o->second);
      c.overridden = true;
      check_component_directory(kind, c.directory, "the override for '" + name + "' ('" + o->second.path + "')",
                                variant);
      if (const auto n = named.find(name); n != named.end()) {
        c.library = n->second.first;
        c.class_name = n->second.second;
      }
      folder.components[name] = c;
      continue;
    }
    const auto n = named.find(name);
    if (const auto source = source_directory(kind, index, root, index_path)) {
      c.directory = *source;
      if (n != named.end()) {
        c.library = n->second.first;
        c.class_name = n->second.second;
      }
      if (required || is_dir(c.directory)) {
        check_component_directory(kind, c.directory, "pipeline folder '" + root + "' (" + kind.source_key + ")", variant);
        folder.components[name] = c;
      }
      continue;
    }
    if (n == named.end()) {
      if (required) {
        throw_value_error("[pipeline] '" + index_path + "' names no component '" + name + "' (expected \"" + name +
                          "\": [\"" + kind.library + "\", \"" + kind.classes.front() +
                          "\"]), and no override gives it");
      }
      continue;
    }
    c.library = n->second.first;
    c.class_name = n->second.second;
    c.directory = (fs::path(root) / name).string();
    if (required) {
      if (c.library != kind.library ||
          std::find(kind.classes.begin(), kind.classes.end(), c.class_name) == kind.classes.end()) {
        throw_value_error("[pipeline] '" + index_path + "': component '" + name + "' is [\"" + c.library + "\", \"" +
                          c.class_name + "\"], expected [\"" + kind.library + "\", one of " + join(kind.classes) +
                          "]");
      }
      check_component_directory(kind, c.directory, "pipeline folder '" + root + "'", variant);
    } else if (!is_dir(c.directory)) {
      continue;  // named but not downloaded, and not needed
    }
    folder.components[name] = c;
  }
  return folder;
}

const std::string& PipelineFolder::directory(const std::string& name) const {
  const auto it = components.find(name);
  if (it == components.end()) {
    throw_value_error("[pipeline] pipeline folder '" + root + "' has no resolved component '" + name + "'");
  }
  return it->second.directory;
}

std::string resolve_component_directory(const std::string& path, const std::string& component,
                                        const std::optional<ComponentOverride>& override, const PipelineLayout& layout,
                                        const std::string& variant) {
  std::map<std::string, ComponentOverride> overrides;
  if (override) overrides[component] = *override;
  if (is_pipeline_folder(path)) {
    return PipelineFolder::open(path, {component}, overrides, layout, variant).directory(component);
  }
  const ComponentKind* kind = kind_of(layout, component);
  if (kind == nullptr) {
    throw_value_error("[pipeline] unknown component '" + component + "'; " + components_of(layout));
  }
  if (override) {
    const std::string dir = override_directory(layout, component, *override);
    check_component_directory(*kind, dir, "the override for '" + component + "' ('" + override->path + "')", variant);
    return dir;
  }
  if (is_dir(path) && is_file(fs::path(path) / kind->marker)) {
    check_component_directory(*kind, path, "'" + component + "' folder", variant);
    return path;
  }
  throw_value_error("[pipeline] '" + path + "' is neither a diffusers pipeline folder (model_index.json) nor a '" +
                    component + "' folder (" + kind->marker + (kind->weights ? " and safetensors weights" : "") + ")");
}

}  // namespace remat::encoders
