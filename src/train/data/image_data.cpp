// Image runs before training (remat/train/data/image_data.h): backends read and scanned, summaries
// printed, the encoders' folder checked, the caching phase run and its report described.
#include "remat/train/data/image_data.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "string_helpers.h"
#include "remat/encoders/flux_encoders.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/memory.h"
#include "remat/train/options/data_options.h"
#include "remat/train/family/family.h"

namespace remat::train {
namespace fs = std::filesystem;

namespace {
// Files named per skip reason in the summary; the rest are counted.
constexpr size_t kNamedPerReason = 3;

std::string reason_kind(const std::string& reason) {
  const auto colon = reason.find(':');
  return colon == std::string::npos ? reason : reason.substr(0, colon);
}

// " (12.34 images/s)", or nothing when nothing was encoded.
std::string rate(int64_t count, double seconds, const char* unit) {
  if (count == 0 || seconds <= 0) return "";
  char out[64];
  std::snprintf(out, sizeof(out), " (%.2f %s/s)", static_cast<double>(count) / seconds, unit);
  return out;
}

// A flavour that trains on pairs (Kontext) needs a conditioning dataset for every image dataset,
// as SimpleTuner's requires_conditioning_dataset; any other flavour would ignore the references.
void check_pairs_fit_flavour(const TrainConfig& config, const std::string& option, const std::string& value,
                             const data::DataBackendConfig& backends) {
  const FlavourSpec* flavour = model_family(config.model_family).flavour(config.model_flavour);
  const bool pairs = flavour && flavour->trains_on_pairs;
  for (const auto& image : backends.images) {
    if (pairs && image.conditioning_data.empty()) {
      throw ValidationError(option, value,
                            "[train] model_flavour " + config.model_flavour + " trains on picture pairs, but dataset '" +
                                image.id + "' names no reference pictures: give it \"conditioning_data\": [\"<id>\"] "
                                "and add that backend with \"dataset_type\": \"conditioning\", \"conditioning_type\": "
                                "\"reference_strict\" (a data_backend_config; pictures pair by relative path)");
    }
    if (!pairs && !image.conditioning_data.empty() && flavour && !flavour->pairs_unsupported.empty()) {
      throw ValidationError(option, value,
                            "[train] dataset '" + image.id + "' has conditioning_data '" + image.conditioning_data.front() +
                                "', but remat trains model_flavour " + config.model_flavour +
                                " from text alone: " + flavour->pairs_unsupported +
                                "; remove conditioning_data (the edit prompt template is still used)");
    }
    if (!pairs && !image.conditioning_data.empty()) {
      throw ValidationError(option, value,
                            "[train] dataset '" + image.id + "' has conditioning_data '" + image.conditioning_data.front() +
                                "', which trains FLUX.1 Kontext (model_family flux, model_flavour kontext); model_flavour " +
                                config.model_flavour + " would ignore its reference pictures");
    }
  }
  // Checked here, before anything is encoded; validation_edits checks it again on the cached data.
  if (pairs && config.validation_requested() && config.eval_dataset_id) {
    std::vector<std::string> ids;
    for (const auto& image : backends.images) ids.push_back(image.id);
    if (std::find(ids.begin(), ids.end(), *config.eval_dataset_id) == ids.end()) {
      throw ValidationError("eval_dataset_id", *config.eval_dataset_id,
                            "[train] eval_dataset_id '" + *config.eval_dataset_id +
                                "' names no enabled image dataset; image datasets: " + remat::detail::join(ids));
    }
  }
}

}  // namespace

bool is_latent_cache_dir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (entry.path().extension() == ".safetensors") return true;
  }
  return false;
}

bool is_image_run(const TrainConfig& config) {
  // An explicit latent cache wins over data_backend_config: a SimpleTuner config pointed at
  // already-encoded samples with --instance_data_dir trains on them (the trainer says so).
  if (config.instance_data_dir && is_latent_cache_dir(*config.instance_data_dir)) return false;
  if (config.data_backend_config) return true;
  if (!config.instance_data_dir) return false;
  std::error_code ec;
  const fs::path dir(*config.instance_data_dir);
  if (!fs::is_directory(dir, ec)) return false;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (data::is_image_file_name(it->path().string())) return true;
  }
  return false;
}

int64_t ScannedImageData::usable_images() const {
  int64_t total = 0;
  for (const auto& d : datasets) total += static_cast<int64_t>(d.images.size());
  return total;
}

ScannedImageData scan_image_data(const TrainConfig& config, const LogFn& log) {
  const auto& family = model_family(config.model_family);
  const std::string option = config.data_backend_config ? "data_backend_config" : "instance_data_dir";
  const std::string value = config.data_backend_config ? *config.data_backend_config
                                                       : config.instance_data_dir.value_or("");
  if (!family.encodes_images()) {
    throw ValidationError(option, value,
                          "[train] " + option + " '" + value + "' is an image dataset, but remat has no image and " +
                              "text encoders for model_family " + family.name +
                              " yet; encode the data elsewhere and train on a latent cache (instance_data_dir " +
                              "holding .safetensors samples)");
  }
  ScannedImageData out;
  const auto defaults = data_defaults(config);
  out.backends = config.data_backend_config ? data::read_data_backend_config(*config.data_backend_config, defaults)
                                            : data::single_folder_config(value, defaults);
  for (const auto& warning : out.backends.warnings) log("[data] warning: " + warning);
  check_pairs_fit_flavour(config, option, value, out.backends);
  const uint64_t seed = static_cast<uint64_t>(config.seed.value_or(0));
  for (const auto& backend : out.backends.images) {
    out.datasets.push_back(data::scan_image_dataset(backend, seed, family.encoders.pixel_multiple));
    auto& scanned = out.datasets.back();
    std::string pairs;
    if (const auto* conditioning = out.backends.conditioning_of(backend)) {
      data::pair_references(scanned, *conditioning, seed, family.encoders.pixel_multiple);
      pairs = " paired with '" + conditioning->id + "' (" + conditioning->instance_data_dir + ", " +
              conditioning->conditioning_type.value_or("") + ")";
    }
    log("[data] dataset '" + backend.id + "' (" + backend.instance_data_dir + "): " +
        std::to_string(scanned.images.size()) + (pairs.empty() ? " image(s)" : " picture pair(s)" + pairs) + ", " +
        std::to_string(scanned.skipped.size()) + " skipped");
    for (const auto& [bucket, count] : scanned.bucket_counts()) {
      log("[data]   bucket " + std::to_string(bucket.first) + "x" + std::to_string(bucket.second) + ": " +
          std::to_string(count) + " image(s)");
    }
    std::map<std::string, std::vector<const data::ScanProblem*>> by_reason;
    for (const auto& problem : scanned.skipped) by_reason[reason_kind(problem.reason)].push_back(&problem);
    for (const auto& [kind, problems] : by_reason) {
      log("[data]   skipped " + std::to_string(problems.size()) + " (" + kind + ")");
      for (size_t i = 0; i < problems.size() && i < kNamedPerReason; ++i) {
        log("[data]     " + problems[i]->path + ": " + problems[i]->reason);
      }
      if (problems.size() > kNamedPerReason) {
        log("[data]     ... and " + std::to_string(problems.size() - kNamedPerReason) + " more");
      }
    }
    for (const auto& warning : scanned.warnings) log("[data]   warning: " + warning.path + ": " + warning.reason);
  }
  if (out.usable_images() == 0) {
    throw ValidationError(option, value,
                          "[train] " + option + " '" + value + "': no usable image in any dataset (every " +
                              "image was skipped; the lines above say why)");
  }
  return out;
}

std::string image_pipeline_folder(const TrainConfig& config) {
  const std::string path = config.pretrained_model_name_or_path.value_or("");
  const auto& encoders = model_family(config.model_family).encoders;
  if (path.empty() || !encoders::is_pipeline_folder(path)) {
    std::string folders;
    for (const auto& component : encoders.components()) folders += ", " + component + "/";
    throw ValidationError("pretrained_model_name_or_path", path,
                          "[train] an image run encodes its pictures and captions first, so "
                          "pretrained_model_name_or_path must be a diffusers pipeline folder (model_index.json" +
                              folders + "), got '" + path + "'" + (path.empty() ? " (unset)" : "") +
                              "; `remat make-demo-pipeline --model_family " + config.model_family +
                              "` writes a tiny one");
  }
  try {
    encoders.open(path, encoders.components(), config.variant.value_or(""));
  } catch (const c10::ValueError& e) {
    throw ValidationError("pretrained_model_name_or_path", path,
                          "[train] an image run needs the pipeline folder's encoders: " +
                              std::string(e.what_without_backtrace()));
  }
  return path;
}

data::CacheReport cache_image_data(const TrainConfig& config, const ScannedImageData& scanned, const LogFn& log,
                                   bool terminal, const data::CacheShare& share) {
  data::CacheOptions options;
  options.pipeline_folder = image_pipeline_folder(config);
  options.variant = config.variant.value_or("");
  options.encoders = model_family(config.model_family).encoders;
  options.dtype = config.mixed_precision == "bf16" ? "bf16" : "fp32";
  options.device = at::Device(config.device);  // resolved by load_train_config ("auto" -> cpu / cuda)
  options.tokenizer_max_length = config.tokenizer_max_length;
  options.flavour = config.model_flavour;
  options.vae_enable_tiling = config.vae_enable_tiling;
  options.seed = static_cast<uint64_t>(config.seed.value_or(0));
  options.log = log;
  options.terminal = terminal;
  options.share = share;
  return data::build_caches(scanned.datasets, scanned.backends, options);
}

std::vector<std::string> describe_cache_report(const data::CacheReport& r) {
  std::vector<std::string> lines;
  lines.push_back("[cache] VAE latents: " + std::to_string(r.images_encoded) + " encoded" +
                  rate(r.images_encoded, r.vae_seconds, "images") + ", " + std::to_string(r.images_reused) +
                  " reused, " + std::to_string(r.images_failed) + " failed; peak " +
                  (r.images_encoded + r.images_failed > 0 ? memory::format_bytes(r.vae_peak_bytes) : "- (VAE not loaded)"));
  lines.push_back("[cache] text embeddings: " + std::to_string(r.captions_encoded) + " encoded" +
                  rate(r.captions_encoded, r.text_seconds, "captions") + ", " + std::to_string(r.captions_reused) +
                  " reused; peak " +
                  (r.captions_encoded > 0 ? memory::format_bytes(r.text_peak_bytes) : "- (text encoders not loaded)"));
  for (const auto& problem : r.problems) lines.push_back("[cache] skipped: " + problem);
  return lines;
}

std::vector<PairedDatasetSpec> cached_datasets(const ScannedImageData& scanned, const data::CacheReport& report) {
  std::vector<PairedDatasetSpec> out;
  for (size_t d = 0; d < scanned.datasets.size() && d < report.samples.size(); ++d) {
    if (report.samples[d].empty()) continue;  // every image skipped: nothing to sample
    const auto& config = scanned.datasets[d].config;
    PairedDatasetSpec spec;
    spec.id = config.id;
    spec.repeats = config.repeats;
    spec.probability = config.probability;
    spec.caption_dropout_probability = config.caption_dropout_probability;
    for (const auto& sample : report.samples[d]) {
      spec.samples.push_back({sample.latents_path, sample.text_path, sample.conditioning_latents_path});
    }
    out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace remat::train
