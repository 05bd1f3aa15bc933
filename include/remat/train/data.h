#pragma once
/// \file
/// Latent-cache datasets: a directory of samples, one `.safetensors` file per sample, holding the
/// VAE latents and text-encoder states that training reads instead of images and captions.
///
/// Keys of one sample file (extra keys are ignored):
///   Flux:     `latents` (C, H, W) with C = 16 and H, W even (2x2 packing);
///             `prompt_embeds` (L, D) T5 states; `pooled_prompt_embeds` (P) CLIP pooled output.
///   MageFlow: `latents` (C, H, W) with C = 128; `prompt_embeds` (L, D) Qwen3-VL states, L may
///             differ between samples.
/// Every sample of one dataset has the same C, D (and P); H, W and L may vary, and batches only
/// ever group samples whose shapes are all equal (bucketing).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "remat/export.h"

namespace remat::train {

/// The model family a latent cache feeds.
enum class LatentFamily { Flux, MageFlow };

/// "flux" or "mageflow".
REMAT_API std::string to_string(LatentFamily family);

/// Parses "flux" / "mageflow" (case-sensitive). Throws c10::ValueError naming the value and the
/// valid names.
REMAT_API LatentFamily parse_latent_family(const std::string& name);

/// VAE latent channels of a family: 16 (Flux VAE) or 128 (MageVAE).
REMAT_API int64_t latent_channels(LatentFamily family);

/// The shapes of one sample, as its file header states them; the bucket key for batching.
struct SampleShape {
  std::vector<int64_t> latents;               ///< (C, H, W)
  std::vector<int64_t> prompt_embeds;         ///< (L, D)
  std::vector<int64_t> pooled_prompt_embeds;  ///< (P) for Flux, empty for MageFlow

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
  at::Tensor pooled_prompt_embeds;  ///< (P); undefined for MageFlow
};

/// Samples of equal shape stacked along a new leading batch dimension.
struct Batch {
  std::vector<int64_t> indices;     ///< dataset indices, in batch order
  at::Tensor latents;               ///< (B, C, H, W)
  at::Tensor prompt_embeds;         ///< (B, L, D)
  at::Tensor pooled_prompt_embeds;  ///< (B, P); undefined for MageFlow
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

  /// The batches of `epoch` (dataset indices). Same (seed, epoch) → same result on any machine.
  std::vector<std::vector<int64_t>> epoch(uint64_t seed, int64_t epoch) const;

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
  /// dtypes, C = latent_channels(family), Flux H and W even, all dimensions > 0, and C, D, P equal
  /// across samples. Throws c10::Error naming the file and the missing or malformed key (or the
  /// directory, if it is missing or holds no sample).
  static LatentDataset open(const std::string& dir, LatentFamily family);

  LatentFamily family() const { return family_; }
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

  /// BatchSampler(shapes(), batch_size).epoch(seed, epoch): see BatchSampler.
  std::vector<std::vector<int64_t>> epoch_batches(uint64_t seed, int64_t epoch,
                                                  int64_t batch_size) const;

 private:
  std::string dir_;
  LatentFamily family_ = LatentFamily::Flux;
  std::vector<std::string> paths_;
  std::vector<SampleShape> shapes_;
};

/// Shape and structure of a generated demo dataset.
struct DemoDatasetOptions {
  /// Latent (H, W) sizes, cycled over samples (sample i gets sizes[i % n]); more than one size
  /// exercises bucketing. Flux sizes must be even. Default: 16x16 (64 packed Flux tokens).
  std::vector<std::pair<int64_t, int64_t>> sizes = {{16, 16}};
  /// Text tokens L. For MageFlow, each caption draws L uniformly from [text_tokens_min,
  /// text_tokens] when text_tokens_min > 0 (variable-length Qwen3-VL states); otherwise L is
  /// fixed. Flux always uses text_tokens.
  int64_t text_tokens = 32;
  int64_t text_tokens_min = 0;
  /// D, the width of prompt_embeds (the model's joint_attention_dim / context_in_dim).
  int64_t joint_attention_dim = 64;
  /// P, the width of pooled_prompt_embeds (Flux only; the model's pooled_projection_dim).
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
/// must not already hold .safetensors files) and returns LatentDataset::open(dir, family).
///
/// The data has learnable structure. Each caption has a code z ~ N(0, I_k). Its embeddings are
/// fixed random linear maps of z: prompt_embeds[l] = z W_l (token-dependent maps) and, for Flux,
/// pooled_prompt_embeds = z W_p. Its latents are z times a fixed basis of low-frequency cosine
/// patterns (frequencies 0..2 per axis, defined on normalised coordinates so every size shows the
/// same picture), scaled to unit variance, plus noise_std Gaussian noise. So the latents are a
/// linear function of, e.g., prompt_embeds[0] up to the noise. Everything is a deterministic
/// function of `seed` and the options; each file is written atomically (save_safetensors).
REMAT_API LatentDataset make_demo_dataset(const std::string& dir, LatentFamily family,
                                          int64_t num_samples, uint64_t seed,
                                          const DemoDatasetOptions& options = {});

}  // namespace remat::train
