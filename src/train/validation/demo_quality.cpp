// The demo quality check (remat/train/validation/demo_quality.h): latent features, the nearest-centroid
// classifier, and the comparison of the base model's samples with the trained LoRA's.
#include "remat/threads.h"
#include "remat/train/validation/demo_quality.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "remat/util/error.h"
#include "remat/io/safetensors.h"
#include "remat/models/lora_formats.h"
#include "remat/sample/sampler.h"
#include "remat/train/data/image_data.h"
#include "remat/train/family/model_source.h"
#include "remat/train/family/text_to_image.h"
#include "remat/train/family/transformer.h"

namespace remat::train {
namespace {

namespace fs = std::filesystem;

const std::set<std::string> kShapes{"circle", "square", "triangle"};
const std::set<std::string> kColours{"red", "green", "blue", "yellow"};
const std::set<std::string> kBackgrounds{"white", "black"};

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// The text cache stores each caption beside its embeddings (remat/data/caches.h).
constexpr const char* kCaptionMetadata = "remat.caption";

}  // namespace

const std::string& DemoCaption::get(const std::string& attribute) const {
  if (attribute == "shape") return shape;
  if (attribute == "colour") return colour;
  if (attribute == "background") return background;
  throw_value_error("[demo-quality] unknown attribute '" + attribute + "' (valid: colour, background, shape)");
}

const std::vector<std::string>& demo_attributes() {
  static const std::vector<std::string> attributes{"colour", "background", "shape"};
  return attributes;
}

std::optional<DemoCaption> parse_demo_caption(const std::string& caption) {
  const auto w = split_words(caption);
  // a <colour> <shape> on a <background> background
  if (w.size() != 7 || w[0] != "a" || w[3] != "on" || w[4] != "a" || w[6] != "background") return std::nullopt;
  if (!kColours.count(w[1]) || !kShapes.count(w[2]) || !kBackgrounds.count(w[5])) return std::nullopt;
  return DemoCaption{w[2], w[1], w[5]};
}

at::Tensor latent_feature(const at::Tensor& latents) {
  if (latents.dim() != 3 || latents.size(1) < 2 || latents.size(2) < 2) {
    throw_value_error("[demo-quality] latents must be (C, h, w) with h, w >= 2, got " +
                      std::string(c10::str(latents.sizes())));
  }
  const at::Tensor x = latents.to(at::kDouble);
  const int64_t h = x.size(1), w = x.size(2);
  const at::Tensor centre = x.slice(1, h / 4, 3 * h / 4).slice(2, w / 4, 3 * w / 4);
  return at::cat({x.mean({1, 2}), centre.mean({1, 2})});
}

std::string classification_group(const DemoCaption& caption, const std::string& attribute) {
  if (attribute == "colour") return caption.colour + "|" + caption.background;
  if (attribute == "background") return caption.background;
  if (attribute == "shape") return caption.shape + "|" + caption.background;
  throw_value_error("[demo-quality] unknown attribute '" + attribute + "' (valid: colour, background, shape)");
}

namespace {

// The attribute a classification group names (its first field).
std::string group_attribute(const std::string& group) { return group.substr(0, group.find('|')); }

}  // namespace

void NearestCentroid::add(const std::string& label, const at::Tensor& feature) {
  auto it = sums_.find(label);
  if (it == sums_.end()) {
    sums_.emplace(label, feature.to(at::kDouble).clone());
  } else {
    it->second += feature.to(at::kDouble);
  }
  ++counts_[label];
}

std::string NearestCentroid::classify(const at::Tensor& feature) const {
  if (sums_.empty()) throw_value_error("[demo-quality] the classifier has no classes");
  std::string best;
  double best_distance = 0;
  for (const auto& [label, sum] : sums_) {
    const double d = (feature.to(at::kDouble) - sum / static_cast<double>(counts_.at(label))).pow(2).sum().item<double>();
    if (best.empty() || d < best_distance) {
      best = label;
      best_distance = d;
    }
  }
  return best;
}

double leave_one_out_accuracy(const std::vector<LabelledLatents>& samples, const std::string& attribute) {
  if (samples.size() < 2) throw_value_error("[demo-quality] leave-one-out needs at least 2 samples");
  std::vector<at::Tensor> features;
  for (const auto& s : samples) features.push_back(latent_feature(s.latents));
  int64_t correct = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    NearestCentroid classifier;
    for (size_t j = 0; j < samples.size(); ++j) {
      if (j != i) classifier.add(classification_group(samples[j].caption, attribute), features[j]);
    }
    correct += group_attribute(classifier.classify(features[i])) == samples[i].caption.get(attribute);
  }
  return static_cast<double>(correct) / static_cast<double>(samples.size());
}

double classified_accuracy(const std::vector<LabelledLatents>& training, const std::vector<LabelledLatents>& samples,
                           const std::string& attribute) {
  if (training.empty() || samples.empty()) throw_value_error("[demo-quality] nothing to classify");
  NearestCentroid classifier;
  for (const auto& s : training) classifier.add(classification_group(s.caption, attribute), latent_feature(s.latents));
  int64_t correct = 0;
  for (const auto& s : samples) {
    correct += group_attribute(classifier.classify(latent_feature(s.latents))) == s.caption.get(attribute);
  }
  return static_cast<double>(correct) / static_cast<double>(samples.size());
}

double mean_feature_distance(const std::vector<LabelledLatents>& reference, const std::vector<LabelledLatents>& samples) {
  if (reference.empty() || samples.empty()) throw_value_error("[demo-quality] nothing to compare");
  at::Tensor centre = at::zeros_like(latent_feature(reference.front().latents));
  for (const auto& s : reference) centre += latent_feature(s.latents);
  centre /= static_cast<double>(reference.size());
  double total = 0;
  for (const auto& s : samples) total += (latent_feature(s.latents) - centre).norm().item<double>();
  return total / static_cast<double>(samples.size());
}

DemoTrainingData read_demo_training_data(const TrainConfig& config, const std::function<void(const std::string&)>& log) {
  if (!is_image_run(config)) {
    throw ValidationError("instance_data_dir", config.instance_data_dir.value_or(""),
                          "[demo-quality] the check reads a run on pictures (make demo's coloured shapes)");
  }
  const ScannedImageData data = scan_image_data(config, log);
  const data::CacheReport report = cache_image_data(config, data, log, /*terminal=*/false);
  DemoTrainingData out;
  std::map<std::string, CachedPrompt> prompts;
  for (const auto& dataset : report.samples) {
    for (const auto& sample : dataset) {
      const auto text = io::SafetensorsFile::open(sample.text_path);
      const auto it = text.metadata().find(kCaptionMetadata);
      const std::string caption = it == text.metadata().end() ? std::string() : it->second;
      const auto parsed = parse_demo_caption(caption);
      if (!parsed) {
        throw ValidationError("instance_data_dir", config.instance_data_dir.value_or(""),
                              "[demo-quality] caption '" + caption + "' of " + sample.latents_path +
                                  " is not a demo caption ('a red circle on a white background'): the check "
                                  "scores make demo's pictures only");
      }
      out.latents.push_back({io::SafetensorsFile::open(sample.latents_path).tensor("latents", at::kFloat), *parsed});
      if (!prompts.count(caption)) {
        prompts[caption] = {caption, text.tensor("prompt_embeds", at::kFloat), text.tensor("pooled_prompt_embeds", at::kFloat)};
      }
    }
  }
  for (auto& [caption, prompt] : prompts) out.prompts.push_back(std::move(prompt));
  return out;
}

namespace {

std::vector<LabelledLatents> sample_all(sample::Denoiser& denoiser, const std::vector<CachedPrompt>& prompts,
                                        const DemoQualityOptions& options, int64_t latent_size,
                                        int64_t vae_scale_factor) {
  std::vector<LabelledLatents> out;
  sample::SamplingSettings settings;
  // The pixel size whose latents the pipeline's VAE makes latent_size wide (the demo's: 32 pixels
  // through its factor 2), as validation and `remat sample` size them.
  settings.vae_scale_factor = vae_scale_factor;
  settings.width = settings.height = latent_size * vae_scale_factor;
  settings.num_inference_steps = options.num_inference_steps;
  settings.guidance_scale = options.guidance_scale;
  for (const auto& prompt : prompts) {
    const sample::PromptEmbeddings embeddings{prompt.prompt_embeds, prompt.pooled_prompt_embeds};
    for (int64_t seed = 0; seed < options.seeds_per_caption; ++seed) {
      settings.seed = static_cast<uint64_t>(seed);
      out.push_back({denoiser.denoise(embeddings, nullptr, settings),
                     *parse_demo_caption(prompt.caption)});
    }
  }
  return out;
}

// One latent per caption: the mean of its samples (the feature is linear in the latents, so this
// is the mean of their features), which averages out what varies with the seed.
std::vector<LabelledLatents> caption_means(const std::vector<LabelledLatents>& samples) {
  std::vector<LabelledLatents> out;
  std::map<std::string, std::pair<at::Tensor, int64_t>> sums;
  for (const auto& s : samples) {
    const std::string key = s.caption.colour + " " + s.caption.shape + " " + s.caption.background;
    auto it = sums.find(key);
    if (it == sums.end()) {
      sums.emplace(key, std::make_pair(s.latents.clone(), int64_t{1}));
      out.push_back({at::Tensor(), s.caption});
    } else {
      it->second.first += s.latents;
      ++it->second.second;
    }
  }
  for (auto& o : out) {
    const auto& [sum, n] = sums.at(o.caption.colour + " " + o.caption.shape + " " + o.caption.background);
    o.latents = sum / static_cast<double>(n);
  }
  return out;
}

// sample_all's samples are ordered by caption, then seed. The mean distance of the features to
// the mean of their group, grouped by seed (how much the caption moves a sample) or by caption
// (how much the seed does).
double spread(const std::vector<LabelledLatents>& samples, int64_t seeds, bool group_by_seed) {
  const int64_t captions = static_cast<int64_t>(samples.size()) / seeds;
  std::vector<at::Tensor> features;
  for (const auto& s : samples) features.push_back(latent_feature(s.latents));
  const auto index = [&](int64_t group, int64_t member) {
    return group_by_seed ? member * seeds + group : group * seeds + member;
  };
  const int64_t groups = group_by_seed ? seeds : captions, members = group_by_seed ? captions : seeds;
  double total = 0;
  for (int64_t g = 0; g < groups; ++g) {
    at::Tensor mean = at::zeros_like(features.front());
    for (int64_t m = 0; m < members; ++m) mean += features[index(g, m)];
    mean /= static_cast<double>(members);
    for (int64_t m = 0; m < members; ++m) total += (features[index(g, m)] - mean).norm().item<double>();
  }
  return total / static_cast<double>(groups * members);
}

}  // namespace

DemoQualityReport measure_demo_quality(const TrainConfig& config, const DemoQualityOptions& options,
                                       const std::function<void(const std::string&)>& log) {
  const ModelFamily& family = model_family(config.model_family);
  if (!family.samples()) {
    throw ValidationError("model_family", config.model_family,
                          "[demo-quality] the demo check samples the trained model, and model_family '" +
                              config.model_family + "' has no sampler in remat");
  }
  if (options.seeds_per_caption < 1 || options.num_inference_steps < 1) {
    throw_value_error("[demo-quality] seeds per caption and steps must be >= 1");
  }
  DemoQualityReport report;
  report.lora_path = options.lora_path.empty()
                         ? (fs::path(config.output_dir) / "pytorch_lora_weights.safetensors").string()
                         : options.lora_path;
  if (!fs::is_regular_file(report.lora_path)) {
    throw_value_error("[demo-quality] no trained LoRA at " + report.lora_path + " (run `make demo` first)");
  }
  set_cpu_threads(config.torch_num_threads);

  const DemoTrainingData data = read_demo_training_data(config, log);
  report.training_latents = static_cast<int64_t>(data.latents.size());
  report.captions = static_cast<int64_t>(data.prompts.size());
  report.latent_size = options.latent_size;
  for (const auto& s : data.latents) {
    if (report.latent_size == 0 && s.latents.size(1) == s.latents.size(2)) report.latent_size = s.latents.size(1);
  }
  if (report.latent_size < 2 || report.latent_size % 2 != 0) {
    throw_value_error("[demo-quality] latent size " + std::to_string(report.latent_size) +
                      " must be even and >= 2 (give one when no training latent is square)");
  }

  const ModelSource source = resolve_model_source(config);
  const TransformerSpec spec = transformer_spec_of(config, source);
  log("[demo-quality] " + source.describe());
  auto model = make_transformer(spec, at::Device(at::kCPU));
  model->module().eval();
  const auto pipeline = make_text_to_image(family, image_pipeline_folder(config), config.model_flavour, &spec,
                                           config.variant.value_or(""));
  const int64_t vae_scale_factor = pipeline->vae_scale_factor();
  report.pixels = report.latent_size * vae_scale_factor;
  const auto denoiser = pipeline->denoiser_for(*model);

  const auto start = std::chrono::steady_clock::now();
  log("[demo-quality] sampling the base model: " + std::to_string(data.prompts.size()) + " captions x " +
      std::to_string(options.seeds_per_caption) + " seeds, " + std::to_string(options.num_inference_steps) + " steps");
  const auto untrained = sample_all(*denoiser, data.prompts, options, report.latent_size, vae_scale_factor);
  // The LoRA is read and merged as `remat sample` does it (any format read_lora_file knows).
  models::merge_lora(model->module(), models::read_lora_file(report.lora_path), 1.0);
  log("[demo-quality] sampling with the trained LoRA " + report.lora_path);
  const auto trained = sample_all(*denoiser, data.prompts, options, report.latent_size, vae_scale_factor);
  report.sampling_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.samples_per_model = static_cast<int64_t>(untrained.size());
  report.distance_training = mean_feature_distance(data.latents, data.latents);
  report.distance_untrained = mean_feature_distance(data.latents, untrained);
  report.distance_trained = mean_feature_distance(data.latents, trained);
  if (options.seeds_per_caption > 1) {
    report.caption_spread_untrained = spread(untrained, options.seeds_per_caption, /*group_by_seed=*/true);
    report.seed_spread_untrained = spread(untrained, options.seeds_per_caption, /*group_by_seed=*/false);
    report.caption_spread_trained = spread(trained, options.seeds_per_caption, /*group_by_seed=*/true);
    report.seed_spread_trained = spread(trained, options.seeds_per_caption, /*group_by_seed=*/false);
  }

  for (const auto& attribute : demo_attributes()) {
    AttributeScore score;
    score.attribute = attribute;
    std::set<std::string> labels;
    for (const auto& s : data.latents) labels.insert(s.caption.get(attribute));
    score.classes = static_cast<int64_t>(labels.size());
    score.chance = 1.0 / static_cast<double>(score.classes);
    score.training_check = leave_one_out_accuracy(data.latents, attribute);
    score.untrained = classified_accuracy(data.latents, untrained, attribute);
    score.trained = classified_accuracy(data.latents, trained, attribute);
    score.untrained_caption_mean = classified_accuracy(data.latents, caption_means(untrained), attribute);
    score.trained_caption_mean = classified_accuracy(data.latents, caption_means(trained), attribute);
    report.scores.push_back(score);
  }
  return report;
}

std::string format_demo_quality(const DemoQualityReport& report) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3);
  out << "                                        per sample         per caption (mean of its samples)\n";
  out << "attribute   classes  chance  training-check  untrained  trained  untrained  trained\n";
  for (const auto& s : report.scores) {
    out << std::left << std::setw(12) << s.attribute << std::right << std::setw(7) << s.classes << std::setw(8)
        << s.chance << std::setw(16) << s.training_check << std::setw(11) << s.untrained << std::setw(9) << s.trained
        << std::setw(11) << s.untrained_caption_mean << std::setw(9) << s.trained_caption_mean << "\n";
  }
  out << "feature distance to the training latents' mean: training latents " << report.distance_training
      << ", untrained samples " << report.distance_untrained << ", trained samples " << report.distance_trained << "\n";
  out << "feature spread of the samples of one seed over the captions / of one caption over the seeds: untrained "
      << report.caption_spread_untrained << " / " << report.seed_spread_untrained << ", trained "
      << report.caption_spread_trained << " / " << report.seed_spread_trained << "\n";
  out << std::defaultfloat << std::setprecision(4);
  out << "training latents " << report.training_latents << " (training-check: leave-one-out nearest centroid), "
      << report.captions << " captions, " << report.samples_per_model << " samples per model at " << report.pixels << "x" << report.pixels
      << " pixels (latent " << report.latent_size << "x" << report.latent_size << "); LoRA " << report.lora_path << "; sampling "
      << report.sampling_seconds << " s\n";
  return out.str();
}

}  // namespace remat::train
