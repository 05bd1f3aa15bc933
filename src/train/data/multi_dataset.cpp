// Cached image datasets (remat/train/data/data.h, MultiDataset): samples whose latents and caption
// embeddings live in two files, several datasets with SimpleTuner's repeats and probability, and
// caption dropout; every draw of an epoch from one generator seeded from (seed, epoch).
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <mutex>
#include <optional>

#include "string_helpers.h"
#include "remat/data/dataset_config.h"
#include "remat/util/error.h"
#include "remat/io/safetensors.h"
#include "remat/train/data/data.h"

namespace remat::train {
namespace {

using data::kMaxRepeats;
// Every occurrence of an epoch is listed (MultiDataset::epoch): a hundred million is ~1 GB of lists.
constexpr int64_t kMaxOccurrencesPerEpoch = 100'000'000;

using remat::detail::shape_text;


// splitmix64 over (seed, epoch) with a tag of its own, so these epochs never share a stream with
// LatentDataset's.
uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  uint64_t z = (seed ^ 0x6d756c7469647321ull) + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(epoch) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform draws from one CPU generator (Philox-free mt19937: the same numbers on every machine).
class Draws {
 public:
  explicit Draws(uint64_t seed) : generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  uint64_t next() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    return at::check_generator<at::CPUGeneratorImpl>(generator_)->random64();
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  template <class T>
  void shuffle(std::vector<T>& items) {  // Fisher-Yates
    for (int64_t i = static_cast<int64_t>(items.size()) - 1; i > 0; --i) std::swap(items[i], items[below(i + 1)]);
  }

 private:
  at::Generator generator_;
};

const io::TensorInfo& require_key(const io::SafetensorsFile& file, const std::string& dataset, const char* key,
                                  size_t rank, const char* layout) {
  if (!file.contains(key)) {
    throw_value_error("[MultiDataset] dataset '" + dataset + "': '" + file.path() + "' has no key '" + key + "' " +
                      layout);
  }
  const auto& info = file.info(key);
  bool positive = true;
  for (auto d : info.shape) positive = positive && d > 0;
  if (info.shape.size() != rank || !at::isFloatingType(info.dtype) || !positive) {
    throw_value_error("[MultiDataset] dataset '" + dataset + "': '" + file.path() + "': " + key + " must be a " +
                      "floating tensor " + layout + " with dimensions > 0, got shape " + shape_text(info.shape));
  }
  return info;
}

// The text half of a sample's shape: prompt_embeds (L, D), pooled (P) when the layout has it.
void read_text_shape(const std::string& path, const std::string& dataset, const LatentLayout& layout,
                     SampleShape& shape) {
  const auto file = io::SafetensorsFile::open(path);
  shape.prompt_embeds = require_key(file, dataset, "prompt_embeds", 2, "(L, D)").shape;
  if (layout.pooled) shape.pooled_prompt_embeds = require_key(file, dataset, "pooled_prompt_embeds", 1, "(P)").shape;
}

// The latents (C, H, W) of a sample or of its reference, checked against the family's layout.
std::vector<int64_t> read_latents_shape(const std::string& path, const std::string& dataset, const LatentLayout& layout) {
  const auto latents = io::SafetensorsFile::open(path);
  std::vector<int64_t> shape = require_key(latents, dataset, "latents", 3, "(C, H, W)").shape;
  const int64_t m = layout.spatial_multiple;
  if (shape[0] != layout.channels || shape[1] % m != 0 || shape[2] % m != 0) {
    throw_value_error("[MultiDataset] dataset '" + dataset + "': '" + latents.path() + "': latents must be (" +
                      std::to_string(layout.channels) + ", H, W) with H and W multiples of " + std::to_string(m) +
                      " for " + layout.family + ", got " + shape_text(shape));
  }
  return shape;
}

}  // namespace

MultiDataset MultiDataset::open(std::vector<PairedDatasetSpec> datasets, const std::string& empty_caption_path,
                                const LatentLayout& layout, int64_t batch_size) {
  if (batch_size < 1) throw_value_error("[MultiDataset] batch_size must be >= 1, got " + std::to_string(batch_size));
  if (datasets.empty()) throw_value_error("[MultiDataset] needs at least one dataset, got 0");
  MultiDataset out;
  out.layout_ = layout;
  out.batch_size_ = batch_size;
  out.empty_caption_path_ = empty_caption_path;
  SampleShape empty;
  bool have_empty = false;
  std::optional<SampleShape> first;  // the widths every caption must share
  std::string first_path;
  double total_probability = 0;
  for (const auto& spec : datasets) {
    const std::string& id = spec.id;
    if (spec.samples.empty()) throw_value_error("[MultiDataset] dataset '" + id + "' has no samples");
    if (spec.repeats < 0 || spec.repeats > kMaxRepeats) {
      throw_value_error("[MultiDataset] dataset '" + id + "': repeats must be in [0, " + std::to_string(kMaxRepeats) +
                        "], got " + std::to_string(spec.repeats));
    }
    // An epoch lists every occurrence; bounded so that it is a list, not an allocation failure.
    if (static_cast<int64_t>(spec.samples.size()) * (spec.repeats + 1) > kMaxOccurrencesPerEpoch) {
      throw_value_error("[MultiDataset] dataset '" + id + "': " + std::to_string(spec.samples.size()) +
                        " sample(s) x (repeats " + std::to_string(spec.repeats) + " + 1) is more than " +
                        std::to_string(kMaxOccurrencesPerEpoch) + " samples in one epoch; lower repeats");
    }
    if (!(spec.probability >= 0) || !std::isfinite(spec.probability)) {
      throw_value_error("[MultiDataset] dataset '" + id + "': probability must be a number >= 0, got " +
                        std::to_string(spec.probability));
    }
    if (!(spec.caption_dropout_probability >= 0 && spec.caption_dropout_probability <= 1)) {
      throw_value_error("[MultiDataset] dataset '" + id + "': caption_dropout_probability must be in [0, 1], got " +
                        std::to_string(spec.caption_dropout_probability));
    }
    total_probability += spec.probability;
    if (spec.caption_dropout_probability > 0 && !have_empty) {
      read_text_shape(empty_caption_path, "(empty caption)", layout, empty);
      have_empty = true;
    }
    std::vector<SampleShape> shapes;
    std::map<SampleShape, std::vector<int64_t>> buckets;
    const bool paired = !spec.samples.front().conditioning_latents_path.empty();
    for (size_t i = 0; i < spec.samples.size(); ++i) {
      SampleShape shape;
      shape.latents = read_latents_shape(spec.samples[i].latents_path, id, layout);
      if (spec.samples[i].conditioning_latents_path.empty() == paired) {
        throw_value_error("[MultiDataset] dataset '" + id + "': sample '" + spec.samples[i].latents_path + "' " +
                          (paired ? "has no" : "has a") + " reference picture, unlike '" +
                          spec.samples.front().latents_path + "'; a dataset's samples are all pairs or none are");
      }
      if (paired) shape.conditioning_latents = read_latents_shape(spec.samples[i].conditioning_latents_path, id, layout);
      read_text_shape(spec.samples[i].text_path, id, layout, shape);
      if (!first) {
        first = shape;
        first_path = spec.samples[i].text_path;
      } else if (shape.prompt_embeds[1] != first->prompt_embeds[1] ||
                 shape.pooled_prompt_embeds != first->pooled_prompt_embeds) {
        throw_value_error("[MultiDataset] dataset '" + id + "': '" + spec.samples[i].text_path +
                          "': text embeddings of widths prompt_embeds " + shape_text(shape.prompt_embeds) +
                          ", pooled " + shape_text(shape.pooled_prompt_embeds) + " differ from '" + first_path +
                          "' (" + shape_text(first->prompt_embeds) + ", " + shape_text(first->pooled_prompt_embeds) +
                          "): every caption must come from the same text encoders");
      }
      // A variable_text_length layout pads each batch's captions (bucket_key), so only widths must agree.
      if (spec.caption_dropout_probability > 0 &&
          (bucket_key(empty, layout).prompt_embeds != bucket_key(shape, layout).prompt_embeds ||
           empty.pooled_prompt_embeds != shape.pooled_prompt_embeds)) {
        throw_value_error("[MultiDataset] dataset '" + id + "': the empty caption's embeddings '" + empty_caption_path +
                          "' " + shape_text(empty.prompt_embeds) + " differ in shape from '" +
                          spec.samples[i].text_path + "' " + shape_text(shape.prompt_embeds) +
                          " (caption dropout swaps one for the other)");
      }
      buckets[bucket_key(shape, layout)].push_back(static_cast<int64_t>(i));
      shapes.push_back(std::move(shape));
    }
    for (const auto& [shape, members] : buckets) {
      const int64_t occurrences = static_cast<int64_t>(members.size()) * (spec.repeats + 1);
      if (spec.probability > 0 && occurrences < batch_size) {
        const int64_t needed = (batch_size + static_cast<int64_t>(members.size()) - 1) /
                                   static_cast<int64_t>(members.size()) - 1;
        throw_value_error("[MultiDataset] dataset '" + id + "': the bucket of latents " + shape_text(shape.latents) +
                          " has " + std::to_string(members.size()) + " sample(s) x (repeats " +
                          std::to_string(spec.repeats) + " + 1) = " + std::to_string(occurrences) +
                          ", fewer than train_batch_size " + std::to_string(batch_size) +
                          ", so it can never fill a batch; set repeats to at least " + std::to_string(needed) +
                          ", lower train_batch_size, or add images of that shape");
      }
    }
    out.shapes_.push_back(std::move(shapes));
    out.buckets_.push_back(std::move(buckets));
  }
  if (!(total_probability > 0)) {
    throw_value_error("[MultiDataset] every dataset has probability 0: at least one must be > 0");
  }
  out.datasets_ = std::move(datasets);
  return out;
}

std::vector<SampleShape> MultiDataset::bucket_shapes() const {
  std::vector<SampleShape> out;
  for (const auto& buckets : buckets_) {
    for (const auto& [shape, members] : buckets) out.push_back(shape);
  }
  return out;
}

int64_t MultiDataset::batches_per_epoch() const {
  int64_t total = 0;
  for (size_t d = 0; d < datasets_.size(); ++d) {
    if (!(datasets_[d].probability > 0)) continue;
    for (const auto& [shape, members] : buckets_[d]) {
      total += static_cast<int64_t>(members.size()) * (datasets_[d].repeats + 1) / batch_size_;
    }
  }
  return total;
}

std::vector<PlannedBatch> MultiDataset::epoch(uint64_t seed, int64_t epoch, int64_t rank, int64_t world_size) const {
  if (!(world_size >= 1 && rank >= 0 && rank < world_size)) {
    throw_value_error("[MultiDataset] rank must be in [0, world_size = " + std::to_string(world_size) + "), got " +
                      std::to_string(rank));
  }
  Draws draws(epoch_seed(seed, epoch));
  // 1. each dataset's full batches, bucket by bucket, shuffled.
  std::vector<std::vector<PlannedBatch>> per_dataset(datasets_.size());
  for (size_t d = 0; d < datasets_.size(); ++d) {
    if (!(datasets_[d].probability > 0)) continue;
    for (const auto& [shape, members] : buckets_[d]) {
      std::vector<int64_t> occurrences;
      for (int64_t r = 0; r <= datasets_[d].repeats; ++r) occurrences.insert(occurrences.end(), members.begin(), members.end());
      draws.shuffle(occurrences);
      for (size_t start = 0; start + batch_size_ <= occurrences.size(); start += batch_size_) {
        PlannedBatch batch;
        batch.dataset = static_cast<int64_t>(d);
        batch.samples.assign(occurrences.begin() + start, occurrences.begin() + start + batch_size_);
        per_dataset[d].push_back(std::move(batch));
      }
    }
    draws.shuffle(per_dataset[d]);
  }
  // 2. interleave: a weighted draw among the datasets with batches left.
  std::vector<PlannedBatch> order;
  std::vector<size_t> next(datasets_.size(), 0);
  for (;;) {
    double total = 0;
    for (size_t d = 0; d < datasets_.size(); ++d) {
      if (next[d] < per_dataset[d].size()) total += datasets_[d].probability;
    }
    if (!(total > 0)) break;
    double u = draws.uniform() * total;
    size_t chosen = datasets_.size();
    for (size_t d = 0; d < datasets_.size(); ++d) {
      if (next[d] >= per_dataset[d].size()) continue;
      chosen = d;  // the last eligible one absorbs rounding at the top end
      if (u < datasets_[d].probability) break;
      u -= datasets_[d].probability;
    }
    order.push_back(std::move(per_dataset[chosen][next[chosen]++]));
  }
  // 3. caption dropout per occurrence, in epoch order.
  for (auto& batch : order) {
    const double p = datasets_[batch.dataset].caption_dropout_probability;
    batch.drop_caption.resize(batch.samples.size());
    for (auto& drop : batch.drop_caption) drop = draws.uniform() < p ? 1 : 0;
  }
  std::vector<PlannedBatch> mine;
  for (size_t i = static_cast<size_t>(rank); i < order.size(); i += static_cast<size_t>(world_size)) {
    mine.push_back(std::move(order[i]));
  }
  return mine;
}

Batch MultiDataset::get_batch(const PlannedBatch& planned) const {
  if (planned.dataset < 0 || planned.dataset >= num_datasets() || planned.samples.empty()) {
    throw_value_error("[MultiDataset] a batch needs a dataset in [0, " + std::to_string(num_datasets()) +
                      ") and at least one sample");
  }
  const auto& spec = datasets_[planned.dataset];
  std::vector<at::Tensor> latents, prompts, pooled, references;
  for (size_t k = 0; k < planned.samples.size(); ++k) {
    const int64_t i = planned.samples[k];
    if (i < 0 || i >= static_cast<int64_t>(spec.samples.size())) {
      throw_value_error("[MultiDataset] dataset '" + spec.id + "': sample index " + std::to_string(i) +
                        " out of range [0, " + std::to_string(spec.samples.size()) + ")");
    }
    const auto latents_file = io::SafetensorsFile::open(spec.samples[i].latents_path);
    const bool drop = k < planned.drop_caption.size() && planned.drop_caption[k];
    const auto text_file = io::SafetensorsFile::open(drop ? empty_caption_path_ : spec.samples[i].text_path);
    const auto& expected = shapes_[planned.dataset][i];
    at::Tensor l = latents_file.tensor("latents");
    at::Tensor p = text_file.tensor("prompt_embeds");
    if (l.sizes().vec() != expected.latents || p.sizes().vec() != expected.prompt_embeds) {
      throw_value_error("[MultiDataset] dataset '" + spec.id + "': '" + spec.samples[i].latents_path +
                        "' or its caption file changed since the dataset was opened");
    }
    if (!expected.conditioning_latents.empty()) {
      const std::string& path = spec.samples[i].conditioning_latents_path;
      at::Tensor r = io::SafetensorsFile::open(path).tensor("latents");
      if (r.sizes().vec() != expected.conditioning_latents) {
        throw_value_error("[MultiDataset] dataset '" + spec.id + "': reference latents '" + path +
                          "' changed since the dataset was opened");
      }
      references.push_back(r);
    }
    latents.push_back(l);
    prompts.push_back(p);
    if (layout_.pooled) pooled.push_back(text_file.tensor("pooled_prompt_embeds"));
  }
  Batch batch;
  batch.indices = planned.samples;
  batch.latents = at::stack(latents);
  batch.prompt_embeds = stack_prompt_embeds(prompts, batch.prompt_lengths);
  if (!pooled.empty()) batch.pooled_prompt_embeds = at::stack(pooled);
  if (!references.empty()) batch.conditioning_latents = at::stack(references);
  return batch;
}

}  // namespace remat::train
