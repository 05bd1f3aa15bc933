#pragma once
/// \file
/// The caching phase of an image run: every image's VAE latents and every distinct caption's text
/// embeddings, computed once and stored in the latent-cache formats training reads
/// (remat/train/data/data.h), then reused while up to date.
///
/// Files: one per image, CACHE_DIR_VAE/<relative path>.safetensors holding `latents` (C, h, w) in
/// float32 (encode_image's output: the posterior's sample, drawn with latent_sample_seed); one per
/// distinct caption (and one for the empty caption, for caption dropout),
/// TEXT_CACHE_DIR/<FNV-1a 128 of encoder identity NUL caption, 32 hex digits>.safetensors holding
/// `prompt_embeds` and `pooled_prompt_embeds` in the encoders' dtype. The encoder identity hashes
/// every file of the component directories (name, size, modification time) and config.json, with
/// the dtype, the VAE seed and tiling, the text token count. Each is written atomically, with metadata: the
/// source file, its size and modification time, the crop and bucket, the encoder's identity (and
/// for text, the caption itself). An entry whose metadata does not match is stale and re-encoded;
/// an interrupted run leaves only whole entries, so the next one resumes where it stopped.
///
/// Phases run one encoder at a time: the VAE encodes every missing latent and is freed, then the
/// text encoders encode every missing caption and are freed, so the phase's peak is the largest
/// component, not the sum.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "remat/data/image_dataset.h"
#include "remat/encoders/model_encoders.h"
#include "remat/export.h"

namespace remat::data {

/// The part of the caching work one process does when several cache the same datasets at once
/// (the processes of a data-parallel run). The default is a process caching alone.
struct CacheShare {
  /// With count > 1, this process encodes only the entries whose key (a picture's dataset id and
  /// relative path, a caption's text: never the cache directory) hashes to index modulo count,
  /// and leaves the rest to the others. After every process has finished its share, an unshared
  /// call finds every entry current (only pictures that failed are tried again) and returns the
  /// whole report.
  int index = 0;
  int count = 1;
  /// Remove the temporaries an interrupted run left in the cache directories. Only a process
  /// that has the directories to itself may: while others cache, a temporary can be another
  /// process's write in progress. So a call with count > 1 never removes them, whatever this says.
  bool remove_interrupted_writes = true;
};

struct CacheOptions {
  std::string pipeline_folder;  ///< the diffusers pipeline folder with the family's encoders
  std::string variant;          ///< the encoders' weights variant (models::find_component_weights); empty: plain
  /// The model family's encoders (its ModelFamily::encoders): what encodes the pictures and the
  /// captions, and the folder components that identify the entries they make.
  encoders::FamilyEncoders encoders;
  std::string dtype = "bf16";   ///< encoders' dtype: "bf16" or "fp32"
  /// Where the encoders run (the training device); the cached tensors are stored from the CPU.
  at::Device device = at::kCPU;
  int64_t tokenizer_max_length = 512;
  /// The model_flavour (EncoderSettings::flavour): what of the prompt encoding depends on it
  /// (FamilyEncoders::prompt_style) is part of the text entries' identity.
  std::string flavour;
  uint64_t seed = 0;            ///< the VAE posterior sample of each image: seeded from (seed, path)
  bool vae_enable_tiling = false;
  /// Progress and messages: one call per line (the CLI draws a bar on a terminal).
  std::function<void(const std::string&)> log;
  bool terminal = false;        ///< draw a redrawn progress bar instead of plain lines
  CacheShare share;             ///< several processes at once: this one's part
};

/// One training sample after caching: its latents file and its caption's embeddings file.
struct CachedSample {
  std::string latents_path;
  std::string text_path;
  std::string dataset_id;
  /// FLUX.1 Kontext: the latents of its reference picture (ScannedDataset::references), in the
  /// conditioning dataset's cache_dir_vae; empty without one.
  std::string conditioning_latents_path;
};

struct CacheReport {
  int64_t images_encoded = 0, images_reused = 0, images_failed = 0;
  int64_t captions_encoded = 0, captions_reused = 0;
  double vae_seconds = 0, text_seconds = 0;
  int64_t vae_peak_bytes = 0, text_peak_bytes = 0;  ///< peak-tracking allocator, per phase
  /// Per dataset (same order as given), its samples; `empty_caption_path` is the embeddings of ""
  /// (caption dropout).
  std::vector<std::vector<CachedSample>> samples;
  std::string empty_caption_path;
  std::vector<std::string> problems;  ///< images that failed to decode at encode time, with reasons
};

/// The seed of the generator that draws `relative_path`'s VAE posterior sample under run seed
/// `seed`: the first 64 bits of FNV-1a 128 over "<seed>\0<relative_path>". A pure function, so the
/// cached latents of an image are the same on every machine and every rerun.
REMAT_API uint64_t latent_sample_seed(uint64_t seed, const std::string& relative_path);

/// Brings every cache up to date for `datasets` (scanned; with their reference pictures, whose
/// latents are cached like the others, their posterior noise seeded from "reference\0<path>")
/// and returns where every sample lives; a pair whose edit or reference fails to encode is left out.
/// The global CPU generator is left as it was (loading an encoder draws from it), so what runs
/// next does not depend on whether the caches were already up to date.
/// A dataset's captions go to the cache_dir of its text_embeds backend in `backends`; the empty
/// caption to the default one's.
REMAT_API CacheReport build_caches(const std::vector<ScannedDataset>& datasets, const DataBackendConfig& backends,
                                   const CacheOptions& options);

}  // namespace remat::data
