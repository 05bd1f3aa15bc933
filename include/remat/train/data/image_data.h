#pragma once
/// \file
/// Image runs: `remat train` (and `remat cache`) on folders of pictures with captions rather than
/// a latent cache. Before any model loads, the datasets are read (multidatabackend.json or the one
/// folder of instance_data_dir), scanned and summarised; then the caching phase brings the VAE
/// latents and caption embeddings up to date (remat/data/caches.h) and its encoders are freed; the
/// trainer then reads the cached samples as a MultiDataset (remat/train/data/data.h).

#include <functional>
#include <string>
#include <vector>

#include "remat/data/caches.h"
#include "remat/data/dataset_config.h"
#include "remat/data/image_dataset.h"
#include "remat/export.h"
#include "remat/train/options/config.h"
#include "remat/train/data/data.h"

namespace remat::train {

using LogFn = std::function<void(const std::string&)>;

/// Whether `path` is a latent-cache directory: a directory with a `.safetensors` file directly in it.
REMAT_API bool is_latent_cache_dir(const std::string& path);

/// Whether `config` trains on pictures: instance_data_dir is not a latent cache, and either
/// data_backend_config is set or instance_data_dir holds at least one picture (at any depth).
/// A latent-cache instance_data_dir wins over data_backend_config (the samples are already
/// encoded; the trainer logs that the backends are not read).
REMAT_API bool is_image_run(const TrainConfig& config);

/// The datasets of an image run, scanned.
struct ScannedImageData {
  data::DataBackendConfig backends;
  std::vector<data::ScannedDataset> datasets;  ///< one per enabled image backend, in file order
  int64_t usable_images() const;
};

/// Reads the backends (read_data_backend_config or single_folder_config, with data_defaults(config)),
/// logs the warning of unimplemented keys, scans every dataset (pixel multiple 16: Flux's VAE
/// factor 8 x 2x2 packing), logs per dataset its images per bucket and what was skipped (a count
/// per reason and the first files), and throws ValidationError when no dataset has a usable image.
/// Also refuses, before anything loads, a model family remat has no image encoders for.
REMAT_API ScannedImageData scan_image_data(const TrainConfig& config, const LogFn& log);

/// The pipeline folder the caching phase loads its encoders from: pretrained_model_name_or_path
/// must be a diffusers pipeline folder with vae/, text_encoder/, text_encoder_2/, tokenizer/ and
/// tokenizer_2/. Throws ValidationError naming the option and what is missing.
REMAT_API std::string image_pipeline_folder(const TrainConfig& config);

/// The caching phase for `data` with the run's settings: encoders in bf16 when mixed_precision is
/// bf16, else fp32; seed = config.seed or 0 (caches depend on the data and the seed only, so an
/// unseeded run still reuses them); terminal: draw a progress bar; share: this process's part
/// when several cache at once (data::CacheShare).
REMAT_API data::CacheReport cache_image_data(const TrainConfig& config, const ScannedImageData& data,
                                             const LogFn& log, bool terminal, const data::CacheShare& share = {});

/// The report's lines: encoded / reused / failed counts, rates and each phase's peak memory.
REMAT_API std::vector<std::string> describe_cache_report(const data::CacheReport& report);

/// The trainer's datasets from a cache report: each backend's samples with its repeats,
/// probability and caption_dropout_probability.
REMAT_API std::vector<PairedDatasetSpec> cached_datasets(const ScannedImageData& data,
                                                         const data::CacheReport& report);

}  // namespace remat::train
