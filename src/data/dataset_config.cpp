// SimpleTuner's multidatabackend.json, read with SimpleTuner's defaults and rules
// (helpers/data_backend/factory.py, config/image.py, config/text_embed.py, config/validators.py at
// bghira/SimpleTuner bc8e6ab7). Every problem is found here, before any model loads: a backend
// type, dataset type or value remat does not support is an error naming the file, the backend id,
// the key, the value and what is supported; keys remat does not implement are collected into one
// warning.
#include "json_file.h"
#include "remat/data/dataset_config.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <c10/util/StringUtil.h>
#include <nlohmann/json.hpp>

#include "string_helpers.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"

namespace remat::data {
namespace {

using Json = nlohmann::json;

using remat::detail::join;

// Keys of a local image backend that remat reads. Anything else in an image backend is listed in
// the one warning (remat does not implement it; the run goes on without it).
const std::set<std::string>& image_keys() {
  static const std::set<std::string> keys = {
      "id", "type", "dataset_type", "disabled", "disable", "instance_data_dir", "caption_strategy",
      "instance_prompt", "prepend_instance_prompt", "only_instance_prompt", "resolution",
      "resolution_type", "minimum_image_size", "maximum_image_size", "target_downsample_size", "crop",
      "crop_style", "crop_aspect", "crop_aspect_buckets", "repeats", "probability", "cache_dir_vae",
      "text_embeds", "text_embed_cache", "conditioning_data"};
  return keys;
}

// A conditioning backend reads the image keys that shape its pictures, plus its own.
const std::set<std::string>& conditioning_keys() {
  static const std::set<std::string> keys = [] {
    std::set<std::string> k = image_keys();
    k.erase("conditioning_data");
    k.insert({"conditioning_type", "source_dataset_id"});
    return k;
  }();
  return keys;
}

const std::set<std::string>& text_embeds_keys() {
  static const std::set<std::string> keys = {"id", "type", "dataset_type", "disabled", "disable", "cache_dir",
                                             "default"};
  return keys;
}

// Reads one backend object; every message names the file and the backend.
class BackendReader {
 public:
  BackendReader(const std::string& file, const Json& backend, std::string id)
      : file_(file), backend_(backend), id_(std::move(id)) {}

  [[noreturn]] void fail(const std::string& key, const Json& value, const std::string& what) const {
    throw_value_error("[data] " + file_ + ": backend '" + id_ + "': " + key + " = " + util::json_excerpt(value) +
                      ": " + what);
  }

  bool has(const std::string& key) const { return backend_.contains(key); }
  const Json& at(const std::string& key) const { return backend_.at(key); }

  std::optional<bool> boolean(const std::string& key) const {
    if (!has(key) || at(key).is_null()) return std::nullopt;
    if (!at(key).is_boolean()) fail(key, at(key), "must be true or false");
    return at(key).get<bool>();
  }

  std::optional<std::string> string(const std::string& key) const {
    if (!has(key) || at(key).is_null()) return std::nullopt;
    if (!at(key).is_string()) fail(key, at(key), "must be a string");
    return at(key).get<std::string>();
  }

  std::optional<double> number(const std::string& key) const {
    if (!has(key) || at(key).is_null()) return std::nullopt;
    if (!at(key).is_number()) fail(key, at(key), "must be a number");
    const double v = at(key).get<double>();
    if (!std::isfinite(v)) fail(key, at(key), "must be a finite number");
    return v;
  }

  // One of `supported`, or an error listing them (and saying which valid SimpleTuner values
  // remat does not implement, when the value is one of those).
  std::optional<std::string> choice(const std::string& key, const std::vector<std::string>& supported,
                                    const std::map<std::string, std::string>& not_implemented = {}) const {
    const auto value = string(key);
    if (!value) return std::nullopt;
    if (std::find(supported.begin(), supported.end(), *value) != supported.end()) return value;
    const auto missing = not_implemented.find(*value);
    if (missing != not_implemented.end()) {
      fail(key, at(key), "is not supported by remat (" + missing->second + "); supported: " + join(supported));
    }
    fail(key, at(key), "is not a valid value; supported: " + join(supported));
  }

 private:
  const std::string& file_;
  const Json& backend_;
  std::string id_;
};

bool is_disabled(const BackendReader& r) {
  return r.boolean("disabled").value_or(false) || r.boolean("disable").value_or(false);
}

ResolutionType parse_resolution_type(const std::string& v) {
  if (v == "pixel") return ResolutionType::pixel;
  if (v == "area") return ResolutionType::area;
  return ResolutionType::pixel_area;
}

CaptionStrategy parse_caption_strategy(const std::string& v) {
  if (v == "textfile") return CaptionStrategy::textfile;
  if (v == "instanceprompt") return CaptionStrategy::instanceprompt;
  return CaptionStrategy::filename;
}

CropStyle parse_crop_style(const std::string& v) {
  if (v == "center" || v == "centre") return CropStyle::center;
  if (v == "corner") return CropStyle::corner;
  return CropStyle::random;
}

CropAspect parse_crop_aspect(const std::string& v) {
  if (v == "preserve") return CropAspect::preserve;
  if (v == "closest") return CropAspect::closest;
  return CropAspect::square;
}

// SimpleTuner measures minimum/maximum_image_size and target_downsample_size of a pixel_area
// backend as pixel edges and converts them to megapixels (v^2 / 1e6) before checking them.
std::optional<double> in_area_units(const ImageDatasetConfig& c, const std::optional<double>& v) {
  if (!v || c.resolution_type != ResolutionType::pixel_area || *v <= 0) return v;
  return *v * *v / 1e6;
}

// SimpleTuner's checks of one image backend's values (validators.py, factory.py,
// metadata/backends/base.py), made before any image is read.
void check_image_values(const BackendReader& r, const ImageDatasetConfig& c) {
  const auto fail = [&](const std::string& key, const Json& value, const std::string& what) {
    r.fail(key, value, what);
  };
  const auto value_of = [&](const std::string& key, const Json& fallback) {
    return r.has(key) ? r.at(key) : fallback;
  };
  if (!(c.resolution > 0)) fail("resolution", value_of("resolution", c.resolution), "must be above 0");
  // Refused, not clamped: 1e308 used to train silently in a 16 x 16 bucket.
  if (c.resolution_type == ResolutionType::area && c.resolution > kMaxResolutionMegapixels) {
    fail("resolution", value_of("resolution", c.resolution),
         "must be at most " + c10::str(kMaxResolutionMegapixels) + " megapixels with resolution_type area");
  }
  if (c.resolution_type != ResolutionType::area && c.resolution > kMaxResolutionPixels) {
    fail("resolution", value_of("resolution", c.resolution),
         "must be at most " + c10::str(kMaxResolutionPixels) + " pixels with resolution_type " +
             to_string(c.resolution_type) + " (the largest picture remat decodes is 8192 x 8192)");
  }
  if (c.resolution_type == ResolutionType::pixel_area && c.resolution != std::floor(c.resolution)) {
    fail("resolution", value_of("resolution", c.resolution),
         "must be a whole number of pixels with resolution_type pixel_area (the edge of a square)");
  }
  for (const auto& [key, value] : {std::pair{"minimum_image_size", c.minimum_image_size},
                                   std::pair{"maximum_image_size", c.maximum_image_size},
                                   std::pair{"target_downsample_size", c.target_downsample_size}}) {
    if (value && *value < 0) fail(key, value_of(key, *value), "must be 0 or more");
  }
  if (c.maximum_image_size && *c.maximum_image_size > 0 &&
      !(c.target_downsample_size && *c.target_downsample_size > 0)) {
    fail("maximum_image_size", value_of("maximum_image_size", *c.maximum_image_size),
         "needs target_downsample_size too (the size very large images are reduced to before the crop)");
  }
  if (c.resolution_type != ResolutionType::pixel) {
    const std::string unit = c.resolution_type == ResolutionType::area ? "megapixels" : "megapixels once squared";
    const auto min_area = in_area_units(c, c.minimum_image_size);
    if (min_area && *min_area > 5) {
      fail("minimum_image_size", value_of("minimum_image_size", *c.minimum_image_size),
           "is more than 5 " + unit + " with resolution_type " + to_string(c.resolution_type) +
               " (probably pixels given where megapixels are meant)");
    }
    for (const auto& [key, value] : {std::pair{"maximum_image_size", c.maximum_image_size},
                                     std::pair{"target_downsample_size", c.target_downsample_size}}) {
      const auto area = in_area_units(c, value);
      if (area && *area >= 20) {
        fail(key, value_of(key, *value),
             "must be under 20 " + unit + " with resolution_type " + to_string(c.resolution_type));
      }
    }
  }
  if (c.repeats < 0) fail("repeats", r.at("repeats"), "must be 0 or more");
  if (c.probability < 0) fail("probability", r.at("probability"), "must be 0 or more");
  if (c.caption_strategy == CaptionStrategy::instanceprompt && !c.instance_prompt) {
    fail("caption_strategy", "instanceprompt", "needs an instance_prompt (in the backend or --instance_prompt)");
  }
  if (c.instance_prompt && c.caption_strategy == CaptionStrategy::instanceprompt &&
      c.instance_prompt->find_first_not_of(" \t\r\n") == std::string::npos) {
    fail("instance_prompt", *c.instance_prompt, "must not be empty with caption_strategy instanceprompt");
  }
  if (c.prepend_instance_prompt && !c.instance_prompt) {
    fail("prepend_instance_prompt", true, "needs an instance_prompt (in the backend or --instance_prompt)");
  }
  if (c.only_instance_prompt && !c.instance_prompt) {
    fail("only_instance_prompt", true, "needs an instance_prompt (in the backend or --instance_prompt)");
  }
  if (c.crop_aspect == CropAspect::closest && c.crop_aspect_buckets.empty()) {
    fail("crop_aspect", "closest", "needs crop_aspect_buckets: a list of aspect ratios (width / height)");
  }
}

std::vector<double> read_aspect_buckets(const BackendReader& r) {
  std::vector<double> out;
  if (!r.has("crop_aspect_buckets") || r.at("crop_aspect_buckets").is_null()) return out;
  const Json& list = r.at("crop_aspect_buckets");
  if (!list.is_array()) r.fail("crop_aspect_buckets", list, "must be a list of aspect ratios (numbers)");
  for (const Json& item : list) {
    if (item.is_object()) {
      r.fail("crop_aspect_buckets", list,
             "weighted buckets ({aspect, weight}) belong to crop_aspect random, which remat does not "
             "support; give plain aspect ratios for crop_aspect closest");
    }
    if (!item.is_number() || !(item.get<double>() > 0) || !std::isfinite(item.get<double>())) {
      r.fail("crop_aspect_buckets", list, "must be a list of aspect ratios (numbers above 0)");
    }
    out.push_back(item.get<double>());
  }
  return out;
}

// conditioning_data: one id or a list of ids (SimpleTuner), each a non-empty string.
std::vector<std::string> read_conditioning_data(const BackendReader& r) {
  std::vector<std::string> out;
  if (!r.has("conditioning_data") || r.at("conditioning_data").is_null()) return out;
  const Json& value = r.at("conditioning_data");
  const auto bad = [&] {
    r.fail("conditioning_data", value, "must be the id of a conditioning dataset, or a list of ids");
  };
  if (value.is_string()) {
    out.push_back(value.get<std::string>());
  } else if (value.is_array()) {
    for (const Json& item : value) {
      if (!item.is_string()) bad();
      out.push_back(item.get<std::string>());
    }
  } else {
    bad();
  }
  for (const auto& id : out) {
    if (id.empty()) bad();
  }
  if (out.size() > 1) {
    r.fail("conditioning_data", value,
           "remat pairs an image dataset with one conditioning dataset (SimpleTuner's "
           "conditioning_multidataset_sampling between several is not implemented); give one id");
  }
  return out;
}

ImageDatasetConfig read_image_backend(const BackendReader& r, const std::string& id, const DataDefaults& d) {
  ImageDatasetConfig c;
  c.id = id;
  const auto dir = r.string("instance_data_dir");
  if (!dir || dir->find_first_not_of(" \t") == std::string::npos) {
    r.fail("instance_data_dir", r.has("instance_data_dir") ? r.at("instance_data_dir") : Json(nullptr),
           "a local backend needs instance_data_dir: the folder of images");
  }
  c.instance_data_dir = *dir;
  while (c.instance_data_dir.size() > 1 && c.instance_data_dir.back() == '/') c.instance_data_dir.pop_back();

  const std::map<std::string, std::string> other_captions = {
      {"parquet", "captions from parquet tables"}, {"huggingface", "Hugging Face datasets"},
      {"webshart", "webshart shards"}, {"csv", "CSV URL lists"}};
  c.caption_strategy = parse_caption_strategy(
      r.choice("caption_strategy", {"filename", "textfile", "instanceprompt"}, other_captions)
          .value_or(to_string(d.caption_strategy)));
  if (r.has("instance_prompt") && r.at("instance_prompt").is_array()) {
    r.fail("instance_prompt", r.at("instance_prompt"),
           "a list of instance prompts is not supported by remat; give one string");
  }
  c.instance_prompt = r.has("instance_prompt") ? r.string("instance_prompt") : d.instance_prompt;
  c.prepend_instance_prompt = r.boolean("prepend_instance_prompt").value_or(false);
  c.only_instance_prompt = r.boolean("only_instance_prompt").value_or(false);

  c.resolution = r.number("resolution").value_or(d.resolution);
  c.resolution_type = r.has("resolution_type")
                          ? parse_resolution_type(*r.choice("resolution_type", {"pixel", "area", "pixel_area"}))
                          : d.resolution_type;
  // A key that is present (even null) replaces the global value, as SimpleTuner's dict.get does.
  c.minimum_image_size = r.has("minimum_image_size") ? r.number("minimum_image_size") : d.minimum_image_size;
  c.maximum_image_size = r.has("maximum_image_size") ? r.number("maximum_image_size") : d.maximum_image_size;
  c.target_downsample_size =
      r.has("target_downsample_size") ? r.number("target_downsample_size") : d.target_downsample_size;

  c.crop = r.boolean("crop").value_or(d.crop);
  c.crop_style = r.has("crop_style")
                     ? parse_crop_style(*r.choice("crop_style", {"center", "centre", "random", "corner"},
                                                  {{"face", "face detection"}}))
                     : d.crop_style;
  c.crop_aspect = r.has("crop_aspect")
                      ? parse_crop_aspect(*r.choice("crop_aspect", {"square", "preserve", "closest"},
                                                    {{"random", "weighted random aspect buckets"}}))
                      : d.crop_aspect;
  c.crop_aspect_buckets = read_aspect_buckets(r);

  // SimpleTuner: `int(repeats) if repeats else 0`; `1.0` for a null or empty probability.
  if (const auto repeats = r.number("repeats")) {
    if (*repeats != std::floor(*repeats)) r.fail("repeats", r.at("repeats"), "must be a whole number");
    if (!(*repeats >= 0 && *repeats <= static_cast<double>(kMaxRepeats))) {
      r.fail("repeats", r.at("repeats"), "must be 0 or more and at most " + std::to_string(kMaxRepeats));
    }
    c.repeats = static_cast<int64_t>(*repeats);
  }
  if (r.has("probability") && !(r.at("probability").is_string() && r.at("probability").get<std::string>().empty())) {
    c.probability = r.number("probability").value_or(1.0);
  }
  c.caption_dropout_probability = d.caption_dropout_probability;
  c.cache_dir_vae = r.string("cache_dir_vae").value_or("");
  if (c.cache_dir_vae.empty()) c.cache_dir_vae = d.cache_dir + "/vae/" + d.family_folder() + "/" + id;
  c.text_embeds = r.string("text_embeds").value_or(r.string("text_embed_cache").value_or(""));
  c.conditioning_data = read_conditioning_data(r);
  check_image_values(r, c);
  return c;
}

// SimpleTuner's conditioning backend (factory.py configure_data_backend: a backend with
// dataset_type conditioning or any conditioning_type is one). remat trains Kontext's references.
ImageDatasetConfig read_conditioning_backend(const BackendReader& r, const std::string& id, const DataDefaults& d) {
  if (r.has("caption_strategy") && !r.at("caption_strategy").is_null()) {
    r.fail("caption_strategy", r.at("caption_strategy"),
           "reference pictures train with their edit picture's caption in remat (SimpleTuner would use the "
           "reference's captions instead, which remat does not implement); set it to null or remove it");
  }
  ImageDatasetConfig c = read_image_backend(r, id, d);
  // Captions of references are never read; the filename strategy needs no caption file.
  c.caption_strategy = CaptionStrategy::filename;
  if (!c.conditioning_data.empty()) {
    r.fail("conditioning_data", r.at("conditioning_data"), "belongs on the image dataset, not on a conditioning one");
  }
  const std::map<std::string, std::string> other_kinds = {
      {"controlnet", "ControlNet conditioning"}, {"mask", "masked-loss training"},
      {"segmentation", "segmentation masks"}};
  c.conditioning_type = r.choice("conditioning_type", {kReferenceStrict, kReferenceLoose}, other_kinds);
  if (!c.conditioning_type) {
    r.fail("conditioning_type", nullptr,
           "a conditioning dataset needs conditioning_type reference_strict (cropped exactly as its edit picture) "
           "or reference_loose (bucketed on its own); SimpleTuner's controlnet and mask kinds are not supported");
  }
  return c;
}

// Pairs image datasets with their conditioning datasets: conditioning_data on the image side, or
// source_dataset_id on the conditioning side (SimpleTuner accepts either), checked both ways.
void link_conditioning(const std::string& path, DataBackendConfig& out,
                       const std::vector<std::pair<std::string, std::string>>& sources) {
  const auto fail = [&](const std::string& id, const std::string& what) {
    throw_value_error("[data] " + path + ": backend '" + id + "': " + what);
  };
  std::vector<std::string> conditioning_ids;
  for (const auto& c : out.conditioning) conditioning_ids.push_back(c.id);
  const auto list = [&] { return conditioning_ids.empty() ? std::string("none") : join(conditioning_ids); };
  const auto find_image = [&](const std::string& id) -> ImageDatasetConfig* {
    for (auto& image : out.images) {
      if (image.id == id) return &image;
    }
    return nullptr;
  };
  for (const auto& [conditioning, source] : sources) {
    ImageDatasetConfig* image = find_image(source);
    if (!image) {
      std::vector<std::string> ids;
      for (const auto& i : out.images) ids.push_back(i.id);
      fail(conditioning, "source_dataset_id = \"" + source + "\" names no enabled image dataset; image datasets: " +
                             (ids.empty() ? std::string("none") : join(ids)));
    }
    if (image->conditioning_data.empty()) image->conditioning_data.push_back(conditioning);
    if (image->conditioning_data.front() != conditioning) {
      fail(image->id, "is paired with conditioning dataset '" + image->conditioning_data.front() +
                          "' and, through its source_dataset_id, with '" + conditioning +
                          "'; remat pairs an image dataset with one");
    }
  }
  std::map<std::string, std::vector<std::string>> users;  // conditioning id -> image ids
  for (const auto& image : out.images) {
    for (const auto& id : image.conditioning_data) {
      if (std::find(conditioning_ids.begin(), conditioning_ids.end(), id) == conditioning_ids.end()) {
        const bool is_image = find_image(id) != nullptr;
        fail(image.id, "conditioning_data names '" + id + "', which is " +
                           (is_image ? "an image dataset: a reference dataset needs conditioning_type "
                                       "reference_strict or reference_loose"
                                     : "no enabled conditioning dataset") +
                           "; conditioning datasets: " + list());
      }
      users[id].push_back(image.id);
    }
  }
  for (const auto& c : out.conditioning) {
    const auto& linked = users[c.id];
    if (linked.empty()) {
      out.warnings.push_back("[data] " + path + ": conditioning dataset '" + c.id +
                             "' is named by no image dataset's conditioning_data (nor has a source_dataset_id); "
                             "it is not used");
    } else if (linked.size() > 1 && c.conditioning_type == kReferenceStrict) {
      fail(c.id, "is reference_strict and paired with image datasets " + join(linked) +
                     "; strict references are cropped as their one edit dataset's pictures, so each needs its own "
                     "(or make it reference_loose)");
    }
  }
}

}  // namespace

const ImageDatasetConfig* DataBackendConfig::conditioning_of(const ImageDatasetConfig& image) const {
  if (image.conditioning_data.empty()) return nullptr;
  for (const auto& c : conditioning) {
    if (c.id == image.conditioning_data.front()) return &c;
  }
  return nullptr;
}

const TextEmbedsConfig& DataBackendConfig::text_embeds_of(const std::string& id) const {
  for (const auto& t : text_embeds) {
    if (t.id == id) return t;
  }
  std::vector<std::string> ids;
  for (const auto& t : text_embeds) ids.push_back("'" + t.id + "'");
  throw_value_error("[data] no text_embeds backend '" + id + "'; the text_embeds backends are: " +
                    (ids.empty() ? std::string("none") : join(ids)));
}

DataBackendConfig read_data_backend_config(const std::string& path, const DataDefaults& defaults) {
  const Json doc = remat::detail::read_json_file(path, "data", "data_backend_config");
  if (!doc.is_array() || doc.empty()) {
    throw_value_error("[data] " + path + ": a data_backend_config is a JSON list of backends (objects), got " +
                      util::json_excerpt(doc));
  }

  DataBackendConfig out;
  std::set<std::string> seen_ids;
  std::vector<std::string> unimplemented;  // "backend 'id': key, key"
  std::vector<std::pair<std::string, std::string>> sources;  // conditioning id -> its source_dataset_id
  size_t position = 0;
  for (const Json& backend : doc) {
    ++position;
    if (!backend.is_object()) {
      throw_value_error("[data] " + path + ": backend " + std::to_string(position) +
                        " must be a JSON object, got " + util::json_excerpt(backend));
    }
    std::string id;
    if (backend.contains("id") && backend.at("id").is_string()) id = backend.at("id").get<std::string>();
    const BackendReader r(path, backend, id.empty() ? "#" + std::to_string(position) : id);
    if (is_disabled(r)) continue;
    if (id.empty()) {
      r.fail("id", backend.contains("id") ? backend.at("id") : Json(nullptr),
             "every backend needs a unique, non-empty string id");
    }
    if (!seen_ids.insert(id).second) r.fail("id", id, "is used by another backend; ids must be unique");

    const std::string type = r.string("type").value_or("local");
    if (type != "local") {
      r.fail("type", type,
             "remat reads local folders only (SimpleTuner's aws, csv, huggingface, memory and webshart "
             "backends are not supported); supported: local");
    }
    std::string dataset_type = r.string("dataset_type").value_or("image");
    if (r.has("conditioning_type") && !r.at("conditioning_type").is_null()) dataset_type = "conditioning";
    const std::set<std::string>* known = nullptr;
    if (dataset_type == "conditioning") {
      out.conditioning.push_back(read_conditioning_backend(r, id, defaults));
      if (const auto source = r.string("source_dataset_id")) sources.emplace_back(id, *source);
      known = &conditioning_keys();
    } else if (dataset_type == "image") {
      out.images.push_back(read_image_backend(r, id, defaults));
      known = &image_keys();
    } else if (dataset_type == "text_embeds") {
      TextEmbedsConfig t;
      t.id = id;
      t.cache_dir = r.string("cache_dir").value_or("");
      if (t.cache_dir.empty()) t.cache_dir = defaults.cache_dir + "/text/" + defaults.family_folder();
      t.is_default = r.boolean("default").value_or(false);
      out.text_embeds.push_back(std::move(t));
      known = &text_embeds_keys();
    } else {
      r.fail("dataset_type", dataset_type,
             "is not supported by remat (SimpleTuner's video, audio, eval, caption, image_embeds and "
             "conditioning_image_embeds datasets are not); supported: image, text_embeds, conditioning");
    }
    std::vector<std::string> ignored;
    for (const auto& item : backend.items()) {
      if (!known->count(item.key())) ignored.push_back(item.key());
    }
    if (!ignored.empty()) unimplemented.push_back("backend '" + id + "': " + join(ignored));
  }

  if (out.images.empty()) {
    throw_value_error("[data] " + path +
                      ": no enabled image backend (a backend with dataset_type image, the default, and an "
                      "instance_data_dir)");
  }
  bool any_drawn = false;
  for (const auto& image : out.images) any_drawn = any_drawn || image.probability > 0;
  if (!any_drawn) {
    throw_value_error("[data] " + path + ": every enabled image backend has probability 0; no batch could be drawn");
  }

  link_conditioning(path, out, sources);

  // SimpleTuner's text_embeds rules: none declared -> a default one is made; one default at most;
  // without a marked default, the first one is the default.
  if (out.text_embeds.empty()) {
    std::string auto_id = "text-embeds";
    for (int suffix = 1; seen_ids.count(auto_id); ++suffix) auto_id = "text-embeds-" + std::to_string(suffix);
    out.text_embeds.push_back({auto_id, defaults.cache_dir + "/text/" + defaults.family_folder(), true});
  }
  std::vector<std::string> defaults_marked;
  for (const auto& t : out.text_embeds) {
    if (t.is_default) defaults_marked.push_back("'" + t.id + "'");
  }
  if (defaults_marked.size() > 1) {
    throw_value_error("[data] " + path + ": only one text_embeds backend can be \"default\": true, got " +
                      join(defaults_marked));
  }
  if (defaults_marked.empty()) out.text_embeds.front().is_default = true;
  const std::string default_id =
      std::find_if(out.text_embeds.begin(), out.text_embeds.end(), [](const auto& t) { return t.is_default; })->id;

  // Two datasets writing latents into one folder would overwrite each other's entries. Folders
  // are compared by what they resolve to (symlinks, "." and ".."), not by spelling: "x/." and
  // "a/../x" are the same cache.
  std::map<std::string, std::string> vae_dirs;  // canonical folder -> backend id
  for (auto& image : out.images) {
    if (image.text_embeds.empty()) {
      image.text_embeds = default_id;
    } else if (std::none_of(out.text_embeds.begin(), out.text_embeds.end(),
                            [&](const auto& t) { return t.id == image.text_embeds; })) {
      std::vector<std::string> ids;
      for (const auto& t : out.text_embeds) ids.push_back(t.id);
      throw_value_error("[data] " + path + ": backend '" + image.id + "': text_embeds = \"" + image.text_embeds +
                        "\": no enabled text_embeds backend has that id; text_embeds backends: " + join(ids));
    }
    const std::string folder = util::canonical_folder(image.cache_dir_vae);
    const auto [it, inserted] = vae_dirs.emplace(folder, image.id);
    if (!inserted) {
      throw_value_error("[data] " + path + ": backend '" + image.id + "': cache_dir_vae = \"" + image.cache_dir_vae +
                        "\" is also the VAE cache of backend '" + it->second + "' (both are '" + folder +
                        "'); each dataset needs its own");
    }
  }
  for (const auto& reference : out.conditioning) {
    const std::string folder = util::canonical_folder(reference.cache_dir_vae);
    const auto [it, inserted] = vae_dirs.emplace(folder, reference.id);
    if (!inserted) {
      throw_value_error("[data] " + path + ": backend '" + reference.id + "': cache_dir_vae = \"" +
                        reference.cache_dir_vae + "\" is also the VAE cache of backend '" + it->second + "' (both are '" +
                        folder + "'); each dataset needs its own");
    }
  }
  for (const auto& t : out.text_embeds) {
    const std::string folder = util::canonical_folder(t.cache_dir);
    if (vae_dirs.count(folder)) {
      throw_value_error("[data] " + path + ": backend '" + t.id + "': cache_dir = \"" + t.cache_dir +
                        "\" is also the VAE cache of backend '" + vae_dirs.at(folder) + "' (both are '" + folder +
                        "'); text embeddings and latents need separate folders");
    }
  }
  if (!unimplemented.empty()) {
    out.warnings.push_back("[data] " + path + ": keys remat does not implement are ignored: " +
                           join(unimplemented, "; "));
  }
  return out;
}

const std::string& DataDefaults::family_folder() const {
  if (model_family.empty()) {
    throw_value_error("[data] the default cache folders are named by the run's model_family, which is unset "
                      "(DataDefaults::model_family)");
  }
  return model_family;
}

DataBackendConfig single_folder_config(const std::string& instance_data_dir, const DataDefaults& defaults) {
  // The same path as a one-backend file, so both are checked by the same rules.
  Json backend = {{"id", "instance_data_dir"}, {"type", "local"}, {"instance_data_dir", instance_data_dir}};
  const std::string where = "--instance_data_dir";
  const BackendReader r(where, backend, "instance_data_dir");
  DataBackendConfig out;
  out.images.push_back(read_image_backend(r, "instance_data_dir", defaults));
  out.text_embeds.push_back({"text-embeds", defaults.cache_dir + "/text/" + defaults.family_folder(), true});
  out.images.front().text_embeds = "text-embeds";
  return out;
}

const char* to_string(ResolutionType value) {
  switch (value) {
    case ResolutionType::pixel: return "pixel";
    case ResolutionType::area: return "area";
    case ResolutionType::pixel_area: return "pixel_area";
  }
  return "?";
}

const char* to_string(CaptionStrategy value) {
  switch (value) {
    case CaptionStrategy::filename: return "filename";
    case CaptionStrategy::textfile: return "textfile";
    case CaptionStrategy::instanceprompt: return "instanceprompt";
  }
  return "?";
}

const char* to_string(CropStyle value) {
  switch (value) {
    case CropStyle::center: return "center";
    case CropStyle::random: return "random";
    case CropStyle::corner: return "corner";
  }
  return "?";
}

const char* to_string(CropAspect value) {
  switch (value) {
    case CropAspect::square: return "square";
    case CropAspect::preserve: return "preserve";
    case CropAspect::closest: return "closest";
  }
  return "?";
}

}  // namespace remat::data
