// The caching phase (remat/data/caches.h): which entries are current, the VAE phase, then the
// text phase, each loading only its encoders and freeing them before the next one loads.
#include "remat/data/caches.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <set>

#include "caches_internal.h"
#include "remat/encoders/model_encoders.h"
#include "remat/image/image_file.h"
#include "remat/util/error.h"
#include "remat/util/generator_guard.h"
#include "remat/util/files.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "remat/out_of_memory.h"

namespace remat::data {
namespace fs = std::filesystem;
using detail::Metadata;

namespace {

// The first 64 bits of FNV-1a 128 over `bytes`: the same on every machine and build, unlike std::hash.
uint64_t fnv1a_128_first_64_bits(const std::string& bytes) {
  return std::stoull(detail::fnv1a_128_hex(bytes).substr(0, 16), nullptr, 16);
}

struct ImageJob {
  const ImageRecord* record = nullptr;
  std::string entry;
  Metadata metadata;
  std::string seed_key;  // what seeds the posterior sample (latent_sample_seed)
};

struct TextJob {
  std::string caption;
  std::string entry;
};

at::ScalarType encoder_dtype(const std::string& name) {
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "fp32" || name == "float32") return at::kFloat;
  throw_value_error("[cache] dtype must be bf16 or fp32, got '" + name + "'");
}

void write_entry(const std::string& path, const std::vector<io::NamedTensor>& tensors, const Metadata& metadata) {
  util::make_directories(fs::path(path).parent_path().string(), "cache", "the cache folder");
  io::save_safetensors(path, tensors, metadata);
}

// Memory admission of the caching phase: the largest picture to encode must fit with the VAE's
// weights, or the run stops before the VAE loads (at resolution 4096, a VAE whose mid-block
// attention spans 2048 x 2048 latent pixels wanted 17 GB per chunk of scores).
void admit_vae_encoding(const encoders::FamilyEncoders& family, const encoders::PipelineFolder& folder,
                        const std::vector<ImageJob>& jobs, const encoders::EncoderSettings& settings, bool tiled) {
  const ImageRecord* largest = nullptr;
  int64_t need = 0;
  for (const auto& job : jobs) {
    const auto& c = job.record->crop;
    const int64_t bytes = family.image_peak_bytes(folder, c.width, c.height, settings.dtype, tiled);
    if (bytes > need) need = bytes, largest = job.record;
  }
  const int64_t weights = family.image_weight_bytes(folder, settings.dtype);
  const int64_t available = memory::available_bytes(settings.device) - memory::current_bytes(settings.device);
  if (largest && need + weights > available) {
    const auto& c = largest->crop;
    throw_value_error("[memory] caching VAE latents: encoding a " + std::to_string(c.width) + " x " +
                      std::to_string(c.height) + " picture ('" + largest->path + "') needs about " +
                      memory::format_bytes(need + weights) + " (the VAE's weights " + memory::format_bytes(weights) +
                      (tiled ? ", one tile's activations " : ", its activations ") + memory::format_bytes(need) +
                      "); this machine has " + memory::format_bytes(available) + " available: lower the dataset's "
                      "resolution" + (tiled ? std::string() : ", or set --vae_enable_tiling"));
  }
}

// Decodes, resizes and crops one image as its TrainingCrop says, and encodes it.
at::Tensor encode_record(encoders::ImageAutoencoder& vae, const ImageRecord& record, uint64_t seed,
                         const std::string& seed_key) {
  at::Tensor picture = image::read_image(record.path);
  if (picture.size(1) != record.width || picture.size(0) != record.height) {
    throw_value_error("[cache] '" + record.path + "' is " + std::to_string(picture.size(1)) + "x" +
                      std::to_string(picture.size(0)) + " pixels, but was " + std::to_string(record.width) + "x" +
                      std::to_string(record.height) + " when the dataset was scanned (changed during the run?)");
  }
  const auto& c = record.crop;
  if (c.resized_width != record.width || c.resized_height != record.height) {
    picture = image::resize_picture(picture, c.resized_width, c.resized_height);
  }
  picture = image::crop_picture(picture, c.crop_left, c.crop_top, c.width, c.height);
  at::Generator generator =
      at::make_generator<at::CPUGeneratorImpl>(latent_sample_seed(seed, seed_key));
  return vae.encode_image(image::picture_to_vae_input(picture), generator).contiguous();
}

// Whether this process encodes the entry named by `key` (CacheShare). The key leaves out where
// the caches live, which machines may mount at different paths.
bool in_share(const std::string& key, const CacheShare& share) {
  if (share.count <= 1) return true;
  return fnv1a_128_first_64_bits(key) % static_cast<uint64_t>(share.count) == static_cast<uint64_t>(share.index);
}

}  // namespace

uint64_t latent_sample_seed(uint64_t seed, const std::string& relative_path) {
  return fnv1a_128_first_64_bits(std::to_string(seed) + '\0' + relative_path);
}

CacheReport build_caches(const std::vector<ScannedDataset>& datasets, const DataBackendConfig& backends,
                         const CacheOptions& options) {
  // Idempotent; without it the per-phase peaks would read 0.
  memory::install_cpu_tracking();
  // Loading an encoder initialises its modules from the global CPU generator before the weights
  // replace them. Restoring the generator afterwards makes a run train the same whether its
  // caches were cold (encoders loaded) or warm (nothing loaded).
  GlobalGeneratorGuard keep_global_generator;
  const CacheShare& share = options.share;
  TORCH_CHECK_VALUE(share.count >= 1 && share.index >= 0 && share.index < share.count,
                    "[cache] a share's index must be in [0, count), got ", share.index, " of ", share.count);
  const bool remove_interrupted_writes = share.remove_interrupted_writes && share.count == 1;
  const auto log = options.log ? options.log : [](const std::string& line) { std::cerr << line << "\n"; };
  const encoders::FamilyEncoders& family = options.encoders;
  TORCH_CHECK_VALUE(family.available(), "[cache] CacheOptions::encoders is unset: the model family's encoders "
                    "(ModelFamily::encoders) encode the pictures and captions");
  encoders::EncoderSettings base;
  base.dtype = encoder_dtype(options.dtype);
  base.device = options.device;
  base.max_sequence_length = options.tokenizer_max_length;
  base.flavour = options.flavour;
  const auto folder = family.open(options.pipeline_folder, family.components(), options.variant);

  // Identities: an entry made by other weights, another dtype, seed or token count is stale.
  const std::string settings = std::string("|") + c10::toString(base.dtype);
  std::string vae_identity = "vae:";
  for (const auto& component : family.image_components) {
    vae_identity += detail::component_identity(folder.directory(component));
  }
  vae_identity += settings + "|sample|seed " + std::to_string(options.seed) + (options.vae_enable_tiling ? "|tiled" : "");
  std::string text_identity = "text:";
  for (const auto& component : family.text_components) {
    text_identity += detail::component_identity(folder.directory(component)) + "|";
  }
  text_identity += settings + "|max_length " + std::to_string(options.tokenizer_max_length);
  if (family.prompt_style) text_identity += "|prompt " + family.prompt_style(options.flavour);

  // Every cache folder is made (or found unusable) before any encoder loads.
  for (const auto& dataset : datasets) {
    util::make_directories(dataset.config.cache_dir_vae, "cache", "dataset '" + dataset.config.id + "': cache_dir_vae");
    if (dataset.references) {
      const auto& c = dataset.references->config;
      util::make_directories(c.cache_dir_vae, "cache", "conditioning dataset '" + c.id + "': cache_dir_vae");
    }
  }
  for (const auto& t : backends.text_embeds) {
    util::make_directories(t.cache_dir, "cache", "text_embeds backend '" + t.id + "': cache_dir");
  }

  CacheReport report;
  // ---- VAE latents ----
  std::vector<ImageJob> image_jobs;
  // Per dataset, per image: the entry of its latents, and of its Kontext reference's.
  std::vector<std::vector<std::string>> latents_paths(datasets.size()), reference_paths(datasets.size());
  const auto want_latents = [&](const ImageDatasetConfig& config, const std::vector<ImageRecord>& records,
                                const std::string& seed_prefix, std::vector<std::string>& paths) {
    if (const auto removed =
            remove_interrupted_writes ? detail::remove_interrupted_writes(config.cache_dir_vae) : 0) {
      log("[cache] removed " + std::to_string(removed) + " partial file(s) an interrupted run left in " +
          config.cache_dir_vae);
    }
    for (const auto& record : records) {
      ImageJob job{&record, detail::image_entry_path(config.cache_dir_vae, record),
                   detail::image_entry_metadata(record, vae_identity), seed_prefix + record.relative_path};
      paths.push_back(job.entry);
      if (detail::entry_is_current(job.entry, job.metadata, {"latents"})) {
        ++report.images_reused;
      } else if (in_share(config.id + '\0' + record.relative_path, share)) {
        image_jobs.push_back(std::move(job));
      }
    }
  };
  for (size_t d = 0; d < datasets.size(); ++d) {
    const auto& dataset = datasets[d];
    want_latents(dataset.config, dataset.images, "", latents_paths[d]);
    // A reference shares its edit's relative path; its own posterior noise comes from another key.
    if (dataset.references) {
      want_latents(dataset.references->config, dataset.references->images, std::string("reference") + '\0',
                   reference_paths[d]);
    }
  }
  std::set<std::string> failed;
  if (!image_jobs.empty()) {
    admit_vae_encoding(family, folder, image_jobs, base, options.vae_enable_tiling);
    memory::PeakScope peak;
    const auto vae = family.load_image(folder, base);
    if (options.vae_enable_tiling) vae->set_tiling(true);
    detail::CacheProgress progress("[cache] VAE latents", "images", static_cast<int64_t>(image_jobs.size()),
                                   options.terminal, log);
    for (const auto& job : image_jobs) {
      at::Tensor latents;
      try {
        latents = encode_record(*vae, *job.record, options.seed, job.seed_key);
      } catch (const c10::Error& e) {
        // Out of memory is the run's problem, not the picture's: stop, naming the size and the way out.
        if (const auto bytes = memory::failed_allocation_bytes(e)) {
          const auto& c = job.record->crop;
          memory::throw_out_of_memory(
              "encoding a " + std::to_string(c.width) + " x " + std::to_string(c.height) + " picture with the VAE",
              "lower the dataset's resolution, or set --vae_enable_tiling", *bytes);
        }
        // A picture that cannot be decoded is reported and left out; the run goes on.
        report.problems.push_back(job.record->path + ": " + e.what_without_backtrace());
        failed.insert(job.entry);
        ++report.images_failed;
        progress.advance();
        continue;
      }
      write_entry(job.entry, {{"latents", latents}}, job.metadata);
      ++report.images_encoded;
      progress.advance();
    }
    progress.finish();
    report.vae_seconds = progress.elapsed_seconds();
    report.vae_peak_bytes = peak.peak_delta();
  }  // the VAE is freed here, before any text encoder loads

  // ---- text embeddings ----
  const TextEmbedsConfig* default_text = nullptr;
  for (const auto& t : backends.text_embeds) {
    if (t.is_default) default_text = &t;
  }
  if (!default_text && backends.text_embeds.size() == 1) default_text = &backends.text_embeds.front();
  if (!default_text) {
    throw_value_error("[cache] no default text_embeds backend: the empty caption (caption dropout) needs one "
                      "(set \"default\": true on one \"dataset_type\": \"text_embeds\" backend)");
  }
  std::map<std::pair<std::string, std::string>, std::string> text_entries;  // (dir, caption) -> file
  std::vector<std::string> text_tensors{"prompt_embeds"};
  if (family.pooled) text_tensors.push_back("pooled_prompt_embeds");
  std::vector<TextJob> text_jobs;
  const auto want_caption = [&](const std::string& dir, const std::string& caption) {
    auto [it, inserted] = text_entries.emplace(std::make_pair(dir, caption), std::string());
    if (!inserted) return it->second;
    it->second = detail::text_entry_path(dir, caption, text_identity);
    if (detail::entry_is_current(it->second, detail::text_entry_metadata(caption, text_identity), text_tensors)) {
      ++report.captions_reused;
    } else if (in_share(caption, share)) {
      text_jobs.push_back({caption, it->second});
    }
    return it->second;
  };
  std::set<std::string> cleaned;
  for (const auto& t : backends.text_embeds) {
    if (remove_interrupted_writes && cleaned.insert(t.cache_dir).second) {
      if (const auto removed = detail::remove_interrupted_writes(t.cache_dir)) {
        log("[cache] removed " + std::to_string(removed) + " partial file(s) an interrupted run left in " +
            t.cache_dir);
      }
    }
  }
  report.empty_caption_path = want_caption(default_text->cache_dir, "");
  report.samples.resize(datasets.size());
  for (size_t d = 0; d < datasets.size(); ++d) {
    const auto& dataset = datasets[d];
    const std::string& dir = dataset.config.text_embeds.empty()
                                 ? default_text->cache_dir
                                 : backends.text_embeds_of(dataset.config.text_embeds).cache_dir;
    for (size_t i = 0; i < dataset.images.size(); ++i) {
      if (failed.count(latents_paths[d][i])) continue;
      const std::string reference = dataset.references ? reference_paths[d][i] : std::string();
      if (!reference.empty() && failed.count(reference)) continue;  // a pair trains whole or not at all
      const std::string text = want_caption(dir, dataset.images[i].caption);
      report.samples[d].push_back({latents_paths[d][i], text, dataset.config.id, reference});
    }
  }
  if (!text_jobs.empty()) {
    memory::PeakScope peak;
    const auto text = family.load_text(folder, base);
    detail::CacheProgress progress("[cache] text embeddings", "captions", static_cast<int64_t>(text_jobs.size()),
                                   options.terminal, log);
    for (const auto& job : text_jobs) {
      auto embeddings = text->encode_caption(job.caption);
      for (const auto& warning : embeddings.warnings) log("[cache] " + warning);
      std::vector<io::NamedTensor> tensors{{"prompt_embeds", embeddings.prompt_embeds.contiguous()}};
      if (family.pooled) tensors.push_back({"pooled_prompt_embeds", embeddings.pooled_prompt_embeds.contiguous()});
      write_entry(job.entry, tensors, detail::text_entry_metadata(job.caption, text_identity));
      ++report.captions_encoded;
      progress.advance();
    }
    progress.finish();
    report.text_seconds = progress.elapsed_seconds();
    report.text_peak_bytes = peak.peak_delta();
  }
  return report;
}

}  // namespace remat::data
