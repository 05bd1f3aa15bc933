// What validation renders and when: the prompts (SimpleTuner's order and prompt library), the
// resolutions (SimpleTuner's parsing and rounding), the trigger, the file names, and the check
// that a run can render at all. The rendering itself is validation_renderer.cpp, the gallery
// validation_gallery.cpp.
#include "string_helpers.h"
#include "remat/train/validation/validation_images.h"

#include <algorithm>
#include <cctype>
#include <cfenv>
#include <cmath>
#include <set>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "remat/io/safetensors.h"
#include "remat/train/data/data.h"
#include "remat/train/family/family.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"

namespace remat::train {
namespace {

using remat::detail::trim;


[[noreturn]] void bad_resolution(const std::string& text, const std::string& why) {
  throw ValidationError("validation_resolution", text,
                        "[train] validation_resolution must be N or WxH (pixels), or several separated by "
                        "commas, " + why + ", got '" + util::text_excerpt(text) + "'");
}

int64_t parse_side(const std::string& digits, const std::string& text) {
  if (digits.empty() || digits.size() > 9) bad_resolution(text, "each side at most " + std::to_string(kMaxValidationSide));
  for (char c : digits) {
    if (!std::isdigit(static_cast<unsigned char>(c))) bad_resolution(text, "digits only");
  }
  return std::stoll(digits);
}

// A shortname becomes part of a file name and of the gallery.
void check_shortname(const std::string& name, const std::string& where) {
  bool safe = !name.empty() && name.size() <= 100 && name.front() != '.';
  for (unsigned char c : name) safe = safe && c >= 0x20 && c != 0x7f && c != '/' && c != '\\';
  if (!safe) {
    throw ValidationError("user_prompt_library", name,
                          "[train] user_prompt_library shortnames must be usable in a file name (1-100 bytes, no "
                          "'/', '\\\\', control characters or leading '.'), got '" + util::text_excerpt(name) + "' in " +
                              where);
  }
}

}  // namespace

std::string ValidationResolution::label() const {
  return std::to_string(requested_width) + "x" + std::to_string(requested_height);
}

int64_t round_validation_side(int64_t pixels) {
  // Python's round(): to nearest, halves to even; FE_TONEAREST is the default rounding mode.
  const double rounded = std::nearbyint(static_cast<double>(pixels) / 16.0) * 16.0;
  return std::max<int64_t>(static_cast<int64_t>(rounded), 16);
}

std::vector<ValidationResolution> parse_validation_resolutions(const std::string& text) {
  std::vector<ValidationResolution> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string piece =
        remat::detail::lower(trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (piece.empty()) bad_resolution(text, "no empty entries");
    ValidationResolution r;
    const size_t x = piece.find('x');
    if (x == std::string::npos) {
      r.requested_width = r.requested_height = parse_side(piece, text);
    } else {
      r.requested_width = parse_side(piece.substr(0, x), text);
      r.requested_height = parse_side(piece.substr(x + 1), text);
    }
    r.width = round_validation_side(r.requested_width);
    r.height = round_validation_side(r.requested_height);
    if (r.width > kMaxValidationSide || r.height > kMaxValidationSide) {
      bad_resolution(text, "each side at most " + std::to_string(kMaxValidationSide));
    }
    out.push_back(r);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::vector<ValidationPrompt> read_user_prompt_library(const std::string& path) {
  const auto fail = [&](const std::string& why) -> ValidationError {
    return ValidationError("user_prompt_library", path, "[train] user_prompt_library '" + path + "' " + why);
  };
  std::string text;
  try {
    text = util::read_regular_file(path, util::kMaxJsonFileBytes, "train", "user_prompt_library");
    util::check_json_text(text, util::kMaxJsonFileBytes, "[train] user_prompt_library '" + path + "'");
  } catch (const ValidationError&) {
    throw;
  } catch (const c10::ValueError& e) {
    throw ValidationError("user_prompt_library", path, e.what_without_backtrace());
  }
  // ordered_json keeps the file's order: the gallery's columns follow it.
  nlohmann::ordered_json doc;
  try {
    doc = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("must be JSON: ") + e.what());
  }
  if (!doc.is_object()) {
    throw fail("must be a JSON object of shortname -> prompt (SimpleTuner's format), got " + util::json_excerpt(doc));
  }
  std::vector<ValidationPrompt> out;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string shortname = trim(it.key());
    if (shortname.empty()) continue;  // SimpleTuner skips blank keys
    const auto& value = it.value();
    const nlohmann::ordered_json* prompt = nullptr;
    if (value.is_string()) {
      prompt = &value;
    } else if (value.is_object()) {
      for (const char* field : {"prompt", "caption", "tags"}) {
        if (value.contains(field) && !value.at(field).is_null()) {
          prompt = &value.at(field);
          break;
        }
      }
    }
    if (prompt == nullptr || !prompt->is_string()) {
      throw fail("entry '" + util::text_excerpt(shortname) + "' must be a prompt string or an object with a "
                 "\"prompt\" (or \"caption\", or \"tags\") string, got " + util::json_excerpt(value));
    }
    check_shortname(shortname, path);
    out.push_back({shortname, prompt->get<std::string>()});
  }
  return out;
}

std::vector<ValidationPrompt> validation_prompts(const TrainConfig& config) {
  std::vector<ValidationPrompt> out;
  if (!config.validation_requested()) return out;
  if (!config.validation_disable_unconditional) out.push_back({"unconditional", ""});
  if (config.user_prompt_library) {
    for (auto& p : read_user_prompt_library(*config.user_prompt_library)) out.push_back(std::move(p));
  }
  if (config.validation_prompt) out.push_back({"validation", *config.validation_prompt});
  std::set<std::string> seen;
  for (const auto& p : out) {
    if (!seen.insert(p.shortname).second) {
      throw ValidationError("user_prompt_library", config.user_prompt_library.value_or(""),
                            "[train] user_prompt_library must not use the shortname '" + p.shortname +
                                "' that validation already renders (unconditional, validation)");
    }
  }
  return out;
}

bool validation_due(const TrainConfig& config, int64_t step) {
  const int64_t interval = config.validation_interval();
  return interval > 0 && step > 0 && step % interval == 0;
}

std::string validation_image_file_name(int64_t step, const std::string& shortname, int64_t index,
                                       const ValidationResolution& resolution, bool ema) {
  return "step_" + std::to_string(step) + "_" + shortname + "_" + std::to_string(index) + "_" + resolution.label() +
         (ema ? "_ema" : "") + ".png";
}

std::string validation_pipeline_folder(const TrainConfig& config) {
  const std::string off = "; set validation_disable=true (or remove validation_prompt and user_prompt_library) "
                          "to train without validation images";
  const ModelFamily& family = model_family(config.model_family);
  if (!family.samples()) {
    throw ValidationError("model_family", config.model_family,
                          "[train] validation images need a model family remat samples; model_family '" +
                              config.model_family + "' (" + family.display_name +
                              ") has no encoders or sampler in remat" + off);
  }
  const std::string path = config.pretrained_model_name_or_path.value_or("");
  if (path.empty() || !encoders::is_pipeline_folder(path)) {
    throw ValidationError("pretrained_model_name_or_path", path,
                          "[train] validation images are rendered with the pipeline's text encoders and VAE, so "
                          "pretrained_model_name_or_path must be a diffusers pipeline folder (model_index.json and "
                          "the components " + detail::join(family.encoders.components(), ", ") + "), got '" + path +
                              "'" + (path.empty() ? " (unset)" : "") + off);
  }
  try {
    family.encoders.open(path, family.encoders.components(), config.variant.value_or(""));
  } catch (const c10::ValueError& e) {
    throw ValidationError("pretrained_model_name_or_path", path,
                          "[train] validation images need the pipeline folder's encoders: " +
                              std::string(e.what_without_backtrace()) + off);
  }
  return path;
}

std::vector<ValidationEdit> validation_edits(const TrainConfig& config, const MultiDataset& data) {
  std::vector<ValidationEdit> out;
  std::vector<std::string> paired;
  for (int64_t d = 0; d < data.num_datasets(); ++d) {
    const PairedDatasetSpec& dataset = data.dataset(d);
    if (dataset.samples.empty() || dataset.samples.front().conditioning_latents_path.empty()) continue;
    paired.push_back(dataset.id);
    if (config.eval_dataset_id && *config.eval_dataset_id != dataset.id) continue;
    const size_t count = std::min<size_t>(static_cast<size_t>(config.num_eval_images), dataset.samples.size());
    for (size_t i = 0; i < count; ++i) {
      const PairedSampleFiles& sample = dataset.samples[i];
      const auto text = io::SafetensorsFile::open(sample.text_path);
      const auto& metadata = text.metadata();
      const auto caption = metadata.find("remat.caption");
      out.push_back({{dataset.id + "_" + std::to_string(i), caption == metadata.end() ? "" : caption->second},
                     sample.text_path,
                     sample.conditioning_latents_path});
    }
  }
  if (config.eval_dataset_id && std::find(paired.begin(), paired.end(), *config.eval_dataset_id) == paired.end()) {
    throw ValidationError("eval_dataset_id", *config.eval_dataset_id,
                          "[validation] eval_dataset_id '" + *config.eval_dataset_id +
                              "' names no image dataset with reference pictures; those are: " +
                              (paired.empty() ? std::string("none") : remat::detail::join(paired)));
  }
  return out;
}

}  // namespace remat::train
