#pragma once
/// \file
/// Latent-cache datasets: a directory of samples, one `.safetensors` file per sample, holding the
/// VAE latents and text-encoder states that training reads instead of images and captions.
///
/// Keys of one sample file (extra keys are ignored):
///   `latents` (C, H, W), C and the H, W multiple as the family's LatentLayout says (Flux: C =
///             16, H and W even for 2x2 packing; MageFlow: C = 128);
///   `prompt_embeds` (L, D) text-encoder states (Flux: T5; MageFlow: Qwen3-VL, L may differ
///             between samples);
///   `pooled_prompt_embeds` (P) when the layout is pooled (Flux: CLIP's pooled output).
/// Every sample of one dataset has the same C, D (and P); H, W and L may vary, and batches only
/// ever group samples whose shapes are all equal (bucketing).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "remat/export.h"

namespace remat::train {

/// What a model family's latent cache holds (ModelFamily::latents, remat/train/family/family.h).
struct LatentLayout {
  std::string family;              ///< the family's name, for messages and file metadata
  int64_t channels = 16;           ///< VAE latent channels C
  int64_t spatial_multiple = 1;    ///< H and W must be multiples of it (Flux: 2 for 2x2 packing)
  bool pooled = false;             ///< samples carry pooled_prompt_embeds (P)
  /// Text lengths L may differ between captions (the demo data then draws them).
  bool variable_text_length = false;
};

/// The shapes of one sample, as its file header states them; the bucket key for batching.
struct SampleShape {
  std::vector<int64_t> latents;               ///< (C, H, W)
  std::vector<int64_t> prompt_embeds;         ///< (L, D)
  std::vector<int64_t> pooled_prompt_embeds;  ///< (P) when pooled, else empty
  std::vector<int64_t> conditioning_latents;  ///< (C, Hc, Wc) of a Kontext reference, else empty

  bool operator==(const SampleShape& other) const {
    return latents == other.latents && prompt_embeds == other.prompt_embeds &&
           pooled_prompt_embeds == other.pooled_prompt_embeds && conditioning_latents == other.conditioning_latents;
  }
  bool operator<(const SampleShape& other) const {
    if (latents != other.latents) return latents < other.latents;
    if (prompt_embeds != other.prompt_embeds) return prompt_embeds < other.prompt_embeds;
    if (pooled_prompt_embeds != other.pooled_prompt_embeds) return pooled_prompt_embeds < other.pooled_prompt_embeds;
    return conditioning_latents < other.conditioning_latents;
  }
};

/// One sample, as owning CPU tensors in the dtype stored in the file.
struct Sample {
  std::string path;                 ///< the file it came from
  at::Tensor latents;               ///< (C, H, W)
  at::Tensor prompt_embeds;         ///< (L, D)
  at::Tensor pooled_prompt_embeds;  ///< (P); undefined unless pooled
};

/// Samples of equal shape stacked along a new leading batch dimension.
struct Batch {
  std::vector<int64_t> indices;     ///< dataset indices, in batch order
  at::Tensor latents;               ///< (B, C, H, W)
  at::Tensor prompt_embeds;         ///< (B, L, D)
  at::Tensor pooled_prompt_embeds;  ///< (B, P); undefined unless pooled
  /// Per sample, its text tokens, when the batch pads captions of different lengths to the longest
  /// (variable_text_length layouts: MageFlow packs each sample's own tokens); empty: every sample
  /// has all L of prompt_embeds.
  std::vector<int64_t> prompt_lengths;
  /// FLUX.1 Kontext: the reference pictures' clean latents (B, C, Hc, Wc), appended to the noisy
  /// latents as tokens of their own (SimpleTuner's conditioning_latents); undefined otherwise.
  at::Tensor conditioning_latents;
  /// Seeds this batch's own noise and sigmas generator (TrainingStep); unset: they come from the
  /// generator the step is given. The trainer sets it from the batch's place in the run, so a
  /// batch draws the same noise whichever process trains it (Note [One run, any world size]).
  std::optional<uint64_t> noise_seed;
};

/// The key a sample is batched by: its shape, with the text length L left out (0) for a
/// variable_text_length layout, whose batches hold captions of any lengths (stack_prompt_embeds).
REMAT_API SampleShape bucket_key(const SampleShape& shape, const LatentLayout& layout);

/// Batch::prompt_embeds of captions (L_i, D): stacked when every L_i is equal; otherwise each is
/// zero-padded to the longest and `lengths` gets every L_i (Batch::prompt_lengths), as SimpleTuner's
/// MageFlow collate_prompt_embeds pads with a mask.
REMAT_API at::Tensor stack_prompt_embeds(const std::vector<at::Tensor>& prompts, std::vector<int64_t>& lengths);

/// Deterministic shuffled batches over samples bucketed by shape.
///
/// One epoch: a permutation of all samples from torch::randperm with a local CPU generator
/// seeded from (seed, epoch) (never the global RNG; distinct epochs and seeds give distinct
/// streams, and (seed, epoch) = (1, 0) differs from (0, 1)). Walking the permutation, each sample
/// joins the open batch of its shape bucket; a batch is emitted when it reaches batch_size.
/// Policy for the remainder: nothing is dropped. Each bucket's last batch may be smaller than
/// batch_size (at most one per bucket). The list of batches is then shuffled with the same
/// generator, so small batches are not always last. Every sample appears exactly once per epoch.
class REMAT_API BatchSampler {
 public:
  /// `shapes[i]` is the bucket key of sample i. Throws c10::ValueError if batch_size < 1 or
  /// shapes is empty.
  BatchSampler(std::vector<SampleShape> shapes, int64_t batch_size);

  /// The batches of `epoch` (dataset indices) that process `rank` of `world_size` trains on:
  /// every rank draws the same epoch order and keeps batches rank, rank + world_size, ...
  /// (world_size 1: all of them). Same (seed, epoch, rank, world_size) → same result on any
  /// machine. Throws c10::ValueError unless 0 <= rank < world_size.
  std::vector<std::vector<int64_t>> epoch(uint64_t seed, int64_t epoch, int64_t rank = 0,
                                          int64_t world_size = 1) const;

  /// Batches per epoch: the sum over buckets of ceil(bucket size / batch_size); independent of
  /// seed and epoch (for learning-rate schedules).
  int64_t batches_per_epoch() const;

  /// Number of distinct shapes.
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

  int64_t batch_size() const { return batch_size_; }

 private:
  std::vector<int64_t> bucket_of_;  // sample -> bucket id
  std::vector<int64_t> buckets_;    // bucket id -> sample count
  int64_t batch_size_;
};

/// A directory of latent-cache samples, read lazily: open() reads only the headers, get() maps
/// one file and copies its tensors.
class REMAT_API LatentDataset {
 public:
  /// Scans `dir` for `*.safetensors` files (regular files, sorted by file name) and validates each
  /// header: required keys present, ranks (latents 3, prompt_embeds 2, pooled 1), floating
  /// dtypes, C = layout.channels, H and W multiples of layout.spatial_multiple, all dimensions > 0, and C, D, P equal
  /// across samples. Throws c10::Error naming the file and the missing or malformed key (or the
  /// directory, if it is missing or holds no sample).
  static LatentDataset open(const std::string& dir, const LatentLayout& layout);

  const LatentLayout& layout() const { return layout_; }
  const std::string& directory() const { return dir_; }

  /// Number of samples.
  int64_t size() const { return static_cast<int64_t>(paths_.size()); }

  /// File of sample i (0 <= i < size()).
  const std::string& path(int64_t i) const;

  /// Shapes of sample i, from its header.
  const SampleShape& shape(int64_t i) const;

  /// Shapes of every sample, in index order.
  const std::vector<SampleShape>& shapes() const { return shapes_; }
  /// bucket_key of every sample: what epoch_batches batches by.
  std::vector<SampleShape> bucket_keys() const;

  /// Reads sample i. Throws c10::Error naming the file if it changed shape since open().
  Sample get(int64_t i) const;

  /// Reads and stacks samples that all have the same shape. Throws c10::ValueError if `indices`
  /// is empty or mixes shapes.
  Batch get_batch(const std::vector<int64_t>& indices) const;

  /// BatchSampler(bucket_keys(), batch_size).epoch(seed, epoch, rank, world_size): see BatchSampler.
  std::vector<std::vector<int64_t>> epoch_batches(uint64_t seed, int64_t epoch, int64_t batch_size,
                                                  int64_t rank = 0, int64_t world_size = 1) const;

 private:
  std::string dir_;
  LatentLayout layout_;
  std::vector<std::string> paths_;
  std::vector<SampleShape> shapes_;
};

// ---- cached image datasets: latents and caption embeddings in separate files ----

/// One sample of a cached image dataset: its latents file (key `latents`) and its caption's
/// embeddings file (`prompt_embeds`, and `pooled_prompt_embeds` when pooled), in the formats above.
struct PairedSampleFiles {
  std::string latents_path;
  std::string text_path;
  /// FLUX.1 Kontext: the reference picture's latents file (key `latents`, (C, Hc, Wc)); empty
  /// without one. Every sample of a dataset has one or none does.
  std::string conditioning_latents_path = {};
};

/// One dataset of a run with SimpleTuner's sampling settings.
struct PairedDatasetSpec {
  std::string id;
  std::vector<PairedSampleFiles> samples;
  int64_t repeats = 0;                     ///< extra passes per epoch (0: each sample once; at most data::kMaxRepeats)
  double probability = 1.0;                ///< relative chance that a batch comes from it (0: never)
  double caption_dropout_probability = 0;  ///< chance a sample trains with the empty caption
};

/// One batch of a MultiDataset epoch: samples of one bucket of one dataset.
struct PlannedBatch {
  int64_t dataset = 0;
  std::vector<int64_t> samples;        ///< indices into that dataset's samples
  std::vector<uint8_t> drop_caption;   ///< per sample: 1 = train with the empty caption
};

/// Several cached image datasets, sampled as SimpleTuner samples its backends.
///
/// Buckets: samples of a dataset with equal shapes (latents (C, H, W), text (L, D), P, and a
/// Kontext reference's (C, Hc, Wc)).
///
/// Epoch `e` under `seed`, all draws from one local generator seeded from (seed, e):
///  1. Per dataset with probability > 0, per bucket: the bucket's samples repeated repeats + 1
///     times (each copy an occurrence) are shuffled and cut into batches of exactly batch_size;
///     the remainder (< batch_size occurrences) is left out of this epoch, as SimpleTuner's
///     sampler marks a bucket exhausted when fewer unseen samples than a batch remain (the
///     shuffle leaves out different samples each epoch). A dataset's batches are then shuffled.
///  2. Batches are interleaved: while any dataset has batches left, one of the datasets with
///     batches left is drawn with chance proportional to its probability and gives its next
///     batch (SimpleTuner's uniform data_backend_sampling: a weighted draw among the datasets
///     not yet exhausted; the epoch ends when every one is). So every dataset is used in full
///     each epoch; probability decides how early and how densely its batches come.
///  3. Caption dropout: every occurrence, in epoch order, draws u ~ U[0, 1); u <
///     caption_dropout_probability of its dataset trains it with the empty caption's embeddings.
/// Processes: every rank computes the same epoch and keeps batches rank, rank + world_size, ...
///
/// A bucket with fewer than batch_size occurrences (samples x (repeats + 1)) can never fill a
/// batch: open() refuses it as SimpleTuner does, naming the dataset, the bucket and the repeats
/// that would make it fill one.
class REMAT_API MultiDataset {
 public:
  /// Reads every sample's headers (both files) and checks them as LatentDataset::open does, plus:
  /// the empty caption's embeddings (`empty_caption_path`) have the text shapes of every sample
  /// of a dataset with caption_dropout_probability > 0; probability >= 0 with at least one > 0;
  /// repeats >= 0; dropout in [0, 1]; every dataset non-empty; no bucket smaller than
  /// `batch_size` occurrences. Throws c10::ValueError naming the dataset and file.
  static MultiDataset open(std::vector<PairedDatasetSpec> datasets, const std::string& empty_caption_path,
                           const LatentLayout& layout, int64_t batch_size);

  const LatentLayout& layout() const { return layout_; }
  int64_t num_datasets() const { return static_cast<int64_t>(datasets_.size()); }
  const PairedDatasetSpec& dataset(int64_t d) const { return datasets_.at(d); }
  /// Shape of sample i of dataset d.
  const SampleShape& shape(int64_t d, int64_t i) const { return shapes_.at(d).at(i); }
  /// One sample's shape per bucket, for checks against the model.
  std::vector<SampleShape> bucket_shapes() const;
  int64_t batch_size() const { return batch_size_; }

  /// The batches of `epoch` for `rank` of `world_size` (see the class comment).
  std::vector<PlannedBatch> epoch(uint64_t seed, int64_t epoch, int64_t rank = 0, int64_t world_size = 1) const;

  /// Batches per epoch (all ranks): the sum over datasets with probability > 0 and their buckets
  /// of floor(bucket size x (repeats + 1) / batch_size). Independent of seed and epoch.
  int64_t batches_per_epoch() const;

  /// Reads and stacks one planned batch; dropped captions read the empty caption's file.
  /// Batch::indices are the dataset's sample indices.
  Batch get_batch(const PlannedBatch& batch) const;

 private:
  LatentLayout layout_;
  std::vector<PairedDatasetSpec> datasets_;
  std::vector<std::vector<SampleShape>> shapes_;
  std::vector<std::map<SampleShape, std::vector<int64_t>>> buckets_;  // per dataset
  std::string empty_caption_path_;
  int64_t batch_size_ = 1;
};

/// Shape and structure of a generated demo dataset.
struct DemoDatasetOptions {
  /// Latent (H, W) sizes, cycled over samples (sample i gets sizes[i % n]); more than one size
  /// exercises bucketing. Multiples of the layout's spatial_multiple. Default: 16x16 (64 packed Flux tokens).
  std::vector<std::pair<int64_t, int64_t>> sizes = {{16, 16}};
  /// Text tokens L. With a variable_text_length layout, each caption draws L uniformly from
  /// [text_tokens_min, text_tokens] when text_tokens_min > 0; otherwise L is fixed.
  int64_t text_tokens = 32;
  int64_t text_tokens_min = 0;
  /// D, the width of prompt_embeds (the model's joint_attention_dim / context_in_dim).
  int64_t joint_attention_dim = 64;
  /// P, the width of pooled_prompt_embeds (pooled layouts; Flux's pooled_projection_dim).
  int64_t pooled_projection_dim = 32;
  /// Distinct captions; sample i uses caption i % num_captions (0: one caption per sample).
  /// Samples sharing a caption have identical embeddings and latents that differ only by noise.
  int64_t num_captions = 0;
  /// Dimension k of the hidden caption code that embeddings and latents are linear functions of.
  int64_t concept_dim = 8;
  /// Standard deviation of the independent Gaussian noise added to every latent.
  double noise_std = 0.05;
  /// Stored dtype of all tensors (floating).
  at::ScalarType dtype = at::kFloat;
};

/// Writes `num_samples` files `sample_000000.safetensors` ... into `dir` (created if needed; it
/// must not already hold .safetensors files) and returns LatentDataset::open(dir, layout).
///
/// The data has learnable structure. Each caption has a code z ~ N(0, I_k). Its embeddings are
/// fixed random linear maps of z: prompt_embeds[l] = z W_l (token-dependent maps) and, for Flux,
/// pooled_prompt_embeds = z W_p (pooled layouts). Its latents are z times a fixed basis of low-frequency cosine
/// patterns (frequencies 0..2 per axis, defined on normalised coordinates so every size shows the
/// same picture), scaled to unit variance, plus noise_std Gaussian noise. So the latents are a
/// linear function of, e.g., prompt_embeds[0] up to the noise. Everything is a deterministic
/// function of `seed` and the options; each file is written atomically (save_safetensors).
REMAT_API LatentDataset make_demo_dataset(const std::string& dir, const LatentLayout& layout,
                                          int64_t num_samples, uint64_t seed,
                                          const DemoDatasetOptions& options = {});

}  // namespace remat::train
