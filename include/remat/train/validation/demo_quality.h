#pragma once
/// \file
/// The quality check of the whole loop on the demo (`remat demo-quality`, docs/SAMPLING.md): does
/// a LoRA trained by `make demo` change what the model samples in the direction of the captions?
///
/// The demo pipeline's VAE has random weights, so decoded pixels are not a faithful picture of
/// what the transformer produced; the check therefore works in the transformer's latent space,
/// where training happened. A latent (a sample, or a cached training latent) is reduced to a
/// size-independent feature: its per-channel means over the whole latent and over the central
/// half window (where the demo's shapes sit). A nearest-centroid classifier fitted on the cached
/// training latents, grouped by what their captions say, then names each sample's colour,
/// background and shape; the score is how often that matches the prompt, beside chance.
///
/// The cached latents are posterior samples of a random VAE (per-position noise about as large
/// as the signal), so even the training latents are classified imperfectly: the "training
/// check" (leave-one-out on them) is the ceiling the measure can show, chance the floor.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "remat/export.h"
#include "remat/train/options/config.h"

namespace remat::train {

/// What a demo caption says: "a red circle on a white background" -> {circle, red, white}.
struct DemoCaption {
  std::string shape;
  std::string colour;
  std::string background;
  /// The value of attribute "shape", "colour" or "background".
  const std::string& get(const std::string& attribute) const;
};

/// The attributes the check scores, in report order.
REMAT_API const std::vector<std::string>& demo_attributes();

/// Parses a caption of remat::data's demo pictures ("a <colour> <shape> on a <background>
/// background"); nullopt for any other text.
REMAT_API std::optional<DemoCaption> parse_demo_caption(const std::string& caption);

/// The feature of latents (C, h, w), h and w >= 2: float64 (2 C), the per-channel means over
/// all positions, then over rows [h/4, 3h/4) and columns [w/4, 3w/4). Throws c10::ValueError for
/// any other shape.
REMAT_API at::Tensor latent_feature(const at::Tensor& latents);

/// The caption classes an attribute is classified by: colour by (colour, background) (a
/// colour's latent depends on what surrounds it), background by background, shape by (shape,
/// background). The class's `attribute` is what is scored.
REMAT_API std::string classification_group(const DemoCaption& caption, const std::string& attribute);

/// Nearest centroid (Euclidean) over labelled feature vectors.
class REMAT_API NearestCentroid {
 public:
  void add(const std::string& label, const at::Tensor& feature);
  /// The label of the nearest class mean. Throws c10::ValueError when nothing was added.
  std::string classify(const at::Tensor& feature) const;
  int64_t classes() const { return static_cast<int64_t>(sums_.size()); }

 private:
  std::map<std::string, at::Tensor> sums_;
  std::map<std::string, int64_t> counts_;
};

/// A latent with the caption it was encoded from (or sampled for).
struct LabelledLatents {
  at::Tensor latents;  ///< (C, h, w) float32
  DemoCaption caption;
};

/// Leave-one-out accuracy of the nearest-centroid classifier on `samples` for `attribute`: each
/// sample classified by centroids of all the others. The check that the measure itself can tell
/// the classes apart. Throws c10::ValueError for fewer than 2 samples.
REMAT_API double leave_one_out_accuracy(const std::vector<LabelledLatents>& samples, const std::string& attribute);

/// The fraction of `samples` whose `attribute` the classifier fitted on `training` names as
/// their caption says.
REMAT_API double classified_accuracy(const std::vector<LabelledLatents>& training,
                                     const std::vector<LabelledLatents>& samples, const std::string& attribute);

/// The mean Euclidean distance of `samples`' features to the mean feature of `reference`: how
/// far from the training data's latents a model's samples lie, whatever their captions.
REMAT_API double mean_feature_distance(const std::vector<LabelledLatents>& reference,
                                       const std::vector<LabelledLatents>& samples);

/// One cached caption: its text and embeddings (as training read them).
struct CachedPrompt {
  std::string caption;
  at::Tensor prompt_embeds;         ///< (N_t, J)
  at::Tensor pooled_prompt_embeds;  ///< (P)
};

/// The run's cached training data: every latent with its caption, and every distinct demo
/// caption's embeddings (sorted by caption). The caches are brought up to date first, exactly as
/// `remat train` does (a no-op after a training run). Throws ValidationError when a caption is
/// not a demo caption (this check is for `make demo`'s pictures).
struct DemoTrainingData {
  std::vector<LabelledLatents> latents;
  std::vector<CachedPrompt> prompts;
};
REMAT_API DemoTrainingData read_demo_training_data(const TrainConfig& config,
                                                   const std::function<void(const std::string&)>& log);

struct DemoQualityOptions {
  int64_t seeds_per_caption = 4;     ///< samples per caption and model: seeds 0 .. n-1
  int64_t num_inference_steps = 20;
  double guidance_scale = 1.0;       ///< the demo trains with flux_guidance_value 1.0
  /// The latent side the samples are drawn at (the demo's square bucket: 32 pixels through the
  /// demo VAE's factor 2 = 16). 0: the side of the first square training latent.
  int64_t latent_size = 0;
  /// The trained LoRA (any form models::read_lora_file reads: PEFT as remat writes it, kohya,
  /// ...), merged with scale 1; empty: output_dir's pytorch_lora_weights.safetensors.
  std::string lora_path;
};

struct AttributeScore {
  std::string attribute;
  int64_t classes = 0;
  double chance = 0;           ///< 1 / classes
  double training_check = 0;   ///< leave-one-out accuracy on the cached training latents
  double untrained = 0;        ///< accuracy of the base model's samples
  double trained = 0;          ///< accuracy of the samples with the trained LoRA
  /// The same with one latent per caption, the mean of its seeds' samples: a weak but consistent
  /// pull towards the caption shows here before it shows in single samples.
  double untrained_caption_mean = 0;
  double trained_caption_mean = 0;
};

struct DemoQualityReport {
  std::vector<AttributeScore> scores;
  int64_t training_latents = 0;
  int64_t captions = 0;
  int64_t samples_per_model = 0;
  int64_t latent_size = 0;
  int64_t pixels = 0;  ///< the samples' side in pixels: latent_size x the pipeline VAE's factor
  std::string lora_path;
  /// mean_feature_distance to the training latents of: the training latents themselves, the
  /// base model's samples, the trained LoRA's samples.
  double distance_training = 0, distance_untrained = 0, distance_trained = 0;
  /// How much the caption moves a sample beside how much the seed does: the mean distance of the
  /// features of one seed's samples to their mean over the captions, and of one caption's
  /// samples to their mean over the seeds (0 with one seed). A model that ignores its prompt has
  /// a caption spread near 0.
  double caption_spread_untrained = 0, seed_spread_untrained = 0;
  double caption_spread_trained = 0, seed_spread_trained = 0;
  double sampling_seconds = 0;  ///< both models' sampling, wall clock
};

/// The whole check: reads the training data, samples every caption with seeds 0 .. n-1 from the
/// base transformer and from it with the trained LoRA, and scores both. Throws ValidationError /
/// c10::ValueError naming a missing LoRA file, a LoRA that does not fit, or a non-Flux config.
REMAT_API DemoQualityReport measure_demo_quality(const TrainConfig& config, const DemoQualityOptions& options,
                                                 const std::function<void(const std::string&)>& log);

/// The report as a table: one row per attribute (classes, chance, training check, untrained,
/// trained), then the settings.
REMAT_API std::string format_demo_quality(const DemoQualityReport& report);

}  // namespace remat::train
