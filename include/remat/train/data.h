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
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "remat/export.h"

namespace remat::train {

/// What a model family's latent cache holds (ModelFamily::latents, remat/train/family.h).
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

  bool operator==(const SampleShape& other) const {
    return latents == other.latents && prompt_embeds == other.prompt_embeds &&
           pooled_prompt_embeds == other.pooled_prompt_embeds;
  }
  bool operator<(const SampleShape& other) const {
    if (latents != other.latents) return latents < other.latents;
    if (prompt_embeds != other.prompt_embeds) return prompt_embeds < other.prompt_embeds;
    return pooled_prompt_embeds < other.pooled_prompt_embeds;
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
};

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

  /// Reads sample i. Throws c10::Error naming the file if it changed shape since open().
  Sample get(int64_t i) const;

  /// Reads and stacks samples that all have the same shape. Throws c10::ValueError if `indices`
  /// is empty or mixes shapes.
  Batch get_batch(const std::vector<int64_t>& indices) const;

  /// BatchSampler(shapes(), batch_size).epoch(seed, epoch, rank, world_size): see BatchSampler.
  std::vector<std::vector<int64_t>> epoch_batches(uint64_t seed, int64_t epoch, int64_t batch_size,
                                                  int64_t rank = 0, int64_t world_size = 1) const;

 private:
  std::string dir_;
  LatentLayout layout_;
  std::vector<std::string> paths_;
  std::vector<SampleShape> shapes_;
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
