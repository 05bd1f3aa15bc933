// Latent-cache datasets: scanning and validating sample files, shape-bucketed batching, and the
// synthetic demo dataset.
#include "remat/train/data/data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>

#include "remat/io/safetensors.h"
#include "remat/memory.h"

namespace remat::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLatents = "latents";
constexpr const char* kPromptEmbeds = "prompt_embeds";
constexpr const char* kPooled = "pooled_prompt_embeds";

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// splitmix64 finaliser: turns (seed, epoch) pairs into well-separated generator seeds, so that
// e.g. (1, 0) and (0, 1) do not collide as seed + epoch would.
uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

at::Generator make_generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// Reads one key's header entry and checks its rank and dtype.
const io::TensorInfo& require(const io::SafetensorsFile& file, const LatentLayout& family,
                              const char* key, size_t rank, const char* layout) {
  TORCH_CHECK(file.contains(key), "[LatentDataset] '", file.path(), "': missing key '", key,
              "' (", family.family, " samples need ",
              family.pooled ? "latents (C, H, W), prompt_embeds (L, D), pooled_prompt_embeds (P)"
                            : "latents (C, H, W), prompt_embeds (L, D)",
              ")");
  const auto& info = file.info(key);
  TORCH_CHECK(info.shape.size() == rank, "[LatentDataset] '", file.path(), "': ", key,
              " must have rank ", rank, " ", layout, ", got shape ", shape_string(info.shape));
  TORCH_CHECK(at::isFloatingType(info.dtype), "[LatentDataset] '", file.path(), "': ", key,
              " must be floating point, got ", info.dtype);
  for (auto d : info.shape) {
    TORCH_CHECK(d > 0, "[LatentDataset] '", file.path(), "': ", key,
                " dimensions must be > 0, got shape ", shape_string(info.shape));
  }
  return info;
}

SampleShape validate_sample(const io::SafetensorsFile& file, const LatentLayout& family) {
  SampleShape shape;
  shape.latents = require(file, family, kLatents, 3, "(C, H, W)").shape;
  shape.prompt_embeds = require(file, family, kPromptEmbeds, 2, "(L, D)").shape;
  if (family.pooled) {
    shape.pooled_prompt_embeds = require(file, family, kPooled, 1, "(P)").shape;
  }
  TORCH_CHECK(shape.latents[0] == family.channels, "[LatentDataset] '", file.path(),
              "': latents must have ", family.channels, " channels for ", family.family,
              " (C, H, W), got shape ", shape_string(shape.latents));
  const int64_t multiple = family.spatial_multiple;
  TORCH_CHECK(shape.latents[1] % multiple == 0 && shape.latents[2] % multiple == 0,
              "[LatentDataset] '", file.path(), "': latents H and W must be ",
              multiple == 2 ? std::string("even") : "multiples of " + std::to_string(multiple),
              " for ", family.family, " (", multiple, "x", multiple, " patches), got shape ",
              shape_string(shape.latents));
  return shape;
}

}  // namespace

// ---- BatchSampler ----

BatchSampler::BatchSampler(std::vector<SampleShape> shapes, int64_t batch_size)
    : batch_size_(batch_size) {
  TORCH_CHECK_VALUE(batch_size >= 1, "[BatchSampler] batch_size must be >= 1, got ", batch_size);
  TORCH_CHECK_VALUE(!shapes.empty(), "[BatchSampler] needs at least one sample, got 0");
  std::map<SampleShape, int64_t> ids;
  for (const auto& shape : shapes) {
    auto [it, inserted] = ids.emplace(shape, static_cast<int64_t>(buckets_.size()));
    if (inserted) buckets_.push_back(0);
    bucket_of_.push_back(it->second);
    ++buckets_[it->second];
  }
}

int64_t BatchSampler::batches_per_epoch() const {
  int64_t total = 0;
  for (auto count : buckets_) total += (count + batch_size_ - 1) / batch_size_;
  return total;
}

std::vector<std::vector<int64_t>> BatchSampler::epoch(uint64_t seed, int64_t epoch, int64_t rank,
                                                     int64_t world_size) const {
  TORCH_CHECK_VALUE(world_size >= 1 && rank >= 0 && rank < world_size,
                    "[BatchSampler] rank must be in [0, world_size = ", world_size, "), got ", rank);
  auto generator = make_generator(mix(seed, static_cast<uint64_t>(epoch)));
  const auto n = static_cast<int64_t>(bucket_of_.size());
  const auto order = at::randperm(n, generator, at::kLong);
  const auto* perm = order.data_ptr<int64_t>();

  std::vector<std::vector<int64_t>> batches;
  std::vector<std::vector<int64_t>> open(buckets_.size());
  for (int64_t i = 0; i < n; ++i) {
    auto& batch = open[bucket_of_[perm[i]]];
    batch.push_back(perm[i]);
    if (static_cast<int64_t>(batch.size()) == batch_size_) {
      batches.push_back(std::move(batch));
      batch.clear();
    }
  }
  for (auto& batch : open) {
    if (!batch.empty()) batches.push_back(std::move(batch));
  }
  const auto batch_order =
      at::randperm(static_cast<int64_t>(batches.size()), generator, at::kLong);
  // Every rank draws the same order and keeps its share: batches rank, rank + W, rank + 2W, ...
  std::vector<std::vector<int64_t>> shuffled;
  for (int64_t i = rank; i < batch_order.numel(); i += world_size) {
    shuffled.push_back(std::move(batches[batch_order.data_ptr<int64_t>()[i]]));
  }
  return shuffled;
}

// ---- LatentDataset ----

LatentDataset LatentDataset::open(const std::string& dir, const LatentLayout& layout) {
  std::error_code ec;
  TORCH_CHECK(fs::is_directory(dir, ec), "[LatentDataset] '", dir, "' is not a directory",
              ec ? ": " + ec.message() : std::string());
  LatentDataset dataset;
  dataset.dir_ = dir;
  dataset.layout_ = layout;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".safetensors") continue;
    // A sample whose status cannot be read (a symlink loop, a dangling link) is named, not
    // skipped: the dataset would silently miss it. FIFOs and directories are not samples.
    std::error_code entry_ec;
    const bool regular = entry.is_regular_file(entry_ec);
    TORCH_CHECK_VALUE(!entry_ec, "[LatentDataset] '", entry.path().string(), "' cannot be read: ", entry_ec.message());
    if (regular) dataset.paths_.push_back(entry.path().string());
  }
  TORCH_CHECK_VALUE(!ec, "[LatentDataset] cannot list '", dir, "': ", ec.message());
  TORCH_CHECK(!dataset.paths_.empty(), "[LatentDataset] '", dir,
              "' holds no .safetensors sample files");
  std::sort(dataset.paths_.begin(), dataset.paths_.end());

  for (const auto& path : dataset.paths_) {
    const auto file = io::SafetensorsFile::open(path);
    auto shape = validate_sample(file, layout);
    if (!dataset.shapes_.empty()) {
      // C is fixed by the family; D and P must agree so that a model can read every sample.
      const auto& first = dataset.shapes_.front();
      TORCH_CHECK(shape.prompt_embeds[1] == first.prompt_embeds[1], "[LatentDataset] '", path,
                  "': prompt_embeds width D must match the first sample ('", dataset.paths_[0],
                  "', D = ", first.prompt_embeds[1], "), got shape ",
                  shape_string(shape.prompt_embeds));
      TORCH_CHECK(shape.pooled_prompt_embeds == first.pooled_prompt_embeds, "[LatentDataset] '",
                  path, "': pooled_prompt_embeds shape must match the first sample ('",
                  dataset.paths_[0], "', ", shape_string(first.pooled_prompt_embeds), "), got ",
                  shape_string(shape.pooled_prompt_embeds));
    }
    dataset.shapes_.push_back(std::move(shape));
  }
  return dataset;
}

const std::string& LatentDataset::path(int64_t i) const {
  TORCH_CHECK_INDEX(i >= 0 && i < size(), "[LatentDataset] index must be in [0, ", size(),
                    "), got ", i);
  return paths_[i];
}

const SampleShape& LatentDataset::shape(int64_t i) const {
  path(i);  // range check
  return shapes_[i];
}

Sample LatentDataset::get(int64_t i) const {
  const auto file = io::SafetensorsFile::open(path(i));
  const auto shape = validate_sample(file, layout_);
  TORCH_CHECK(shape == shapes_[i], "[LatentDataset] '", file.path(),
              "' changed since the dataset was opened: latents ", shape_string(shape.latents),
              " (was ", shape_string(shapes_[i].latents), "), prompt_embeds ",
              shape_string(shape.prompt_embeds), " (was ", shape_string(shapes_[i].prompt_embeds),
              ")");
  Sample sample;
  sample.path = file.path();
  sample.latents = file.tensor(kLatents);
  sample.prompt_embeds = file.tensor(kPromptEmbeds);
  if (layout_.pooled) sample.pooled_prompt_embeds = file.tensor(kPooled);
  return sample;
}

SampleShape bucket_key(const SampleShape& shape, const LatentLayout& layout) {
  SampleShape key = shape;
  if (layout.variable_text_length && !key.prompt_embeds.empty()) key.prompt_embeds[0] = 0;
  return key;
}

at::Tensor stack_prompt_embeds(const std::vector<at::Tensor>& prompts, std::vector<int64_t>& lengths) {
  TORCH_CHECK_VALUE(!prompts.empty(), "[data] no captions to stack");
  int64_t longest = 0;
  bool equal = true;
  for (const auto& p : prompts) {
    TORCH_CHECK_VALUE(p.dim() == 2 && p.size(1) == prompts[0].size(1), "[data] captions must be (L, D) of one D, got ",
                      p.sizes(), " and ", prompts[0].sizes());
    longest = std::max(longest, p.size(0));
    equal = equal && p.size(0) == prompts[0].size(0);
  }
  lengths.clear();
  if (equal) return at::stack(prompts);
  std::vector<at::Tensor> padded;
  for (const auto& p : prompts) {
    lengths.push_back(p.size(0));
    padded.push_back(at::constant_pad_nd(p, {0, 0, 0, longest - p.size(0)}, 0));
  }
  return at::stack(padded);
}

std::vector<SampleShape> LatentDataset::bucket_keys() const {
  std::vector<SampleShape> keys;
  for (const auto& s : shapes_) keys.push_back(bucket_key(s, layout_));
  return keys;
}

Batch LatentDataset::get_batch(const std::vector<int64_t>& indices) const {
  TORCH_CHECK_VALUE(!indices.empty(), "[LatentDataset] a batch needs at least one index, got 0");
  for (auto i : indices) {
    TORCH_CHECK_VALUE(bucket_key(shape(i), layout_) == bucket_key(shape(indices[0]), layout_),
                      "[LatentDataset] a batch must hold samples of ",
                      "one shape; sample ", i, " has latents ", shape_string(shape(i).latents),
                      ", prompt_embeds ", shape_string(shape(i).prompt_embeds), " but sample ",
                      indices[0], " has latents ", shape_string(shape(indices[0]).latents),
                      ", prompt_embeds ", shape_string(shape(indices[0]).prompt_embeds));
  }
  std::vector<at::Tensor> latents, prompts, pooled;
  for (auto i : indices) {
    auto sample = get(i);
    latents.push_back(sample.latents);
    prompts.push_back(sample.prompt_embeds);
    if (sample.pooled_prompt_embeds.defined()) pooled.push_back(sample.pooled_prompt_embeds);
  }
  Batch batch;
  batch.indices = indices;
  batch.latents = at::stack(latents);
  batch.prompt_embeds = stack_prompt_embeds(prompts, batch.prompt_lengths);
  if (!pooled.empty()) batch.pooled_prompt_embeds = at::stack(pooled);
  return batch;
}

std::vector<std::vector<int64_t>> LatentDataset::epoch_batches(uint64_t seed, int64_t epoch,
                                                               int64_t batch_size, int64_t rank,
                                                               int64_t world_size) const {
  return BatchSampler(bucket_keys(), batch_size).epoch(seed, epoch, rank, world_size);
}

// ---- demo dataset ----

namespace {

// Low-frequency cosine basis on normalised coordinates: (F, H, W) with F = 9 patterns
// cos(pi u (y + 0.5) / H) cos(pi v (x + 0.5) / W), u, v in {0, 1, 2}.
at::Tensor cosine_patterns(int64_t height, int64_t width) {
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const auto y = (at::arange(height, opts) + 0.5) / static_cast<double>(height);
  const auto x = (at::arange(width, opts) + 0.5) / static_cast<double>(width);
  std::vector<at::Tensor> patterns;
  for (int u = 0; u < 3; ++u) {
    for (int v = 0; v < 3; ++v) {
      patterns.push_back(at::outer(at::cos(M_PI * u * y), at::cos(M_PI * v * x)));
    }
  }
  return at::stack(patterns);
}

// What generating a demo dataset takes, in bytes: `memory` at the peak (the float64 world maps,
// the cosine patterns and one sample's temporaries) and `disk` (every sample file). Computed with
// checked arithmetic before anything is allocated: sizes come from flags, and a product that
// wraps must not pass for a small one. nullopt when a figure would not fit int64.
struct DemoBytes {
  int64_t memory = 0;
  int64_t disk = 0;
};

std::optional<DemoBytes> demo_dataset_bytes(const LatentLayout& layout, int64_t num_samples,
                                            const DemoDatasetOptions& o) {
  bool overflow = false;
  const auto mul = [&](std::initializer_list<int64_t> factors) {
    int64_t out = 1;
    for (int64_t f : factors) overflow = overflow || __builtin_mul_overflow(out, f, &out);
    return out;
  };
  const auto add = [&](int64_t a, int64_t b) {
    int64_t out = 0;
    overflow = overflow || __builtin_add_overflow(a, b, &out);
    return out;
  };
  const int64_t k = o.concept_dim, L = o.text_tokens, D = o.joint_attention_dim, C = layout.channels;
  const int64_t P = layout.pooled ? o.pooled_projection_dim : 0;
  const int64_t element = static_cast<int64_t>(c10::elementSize(o.dtype));
  const int64_t captions = o.num_captions > 0 ? o.num_captions : num_samples;
  // The world: token_maps (L, k, D) with two temporaries of its size, the other maps, the codes.
  int64_t memory = mul({3, L, k, D, 8});
  memory = add(memory, mul({add(mul({k, add(D, add(P, mul({C, 9})))}), mul({captions, add(k, 1)})), 8}));
  int64_t largest = 0, disk = 0;
  for (const auto& [h, w] : o.sizes) {
    memory = add(memory, mul({9, h, w, 8}));  // (9, H*W) patterns per size
    largest = std::max(largest, mul({h, w}));
  }
  // One sample: latents (C, H, W) and its noise, sum and cast, the prompt (L, D).
  memory = add(memory, mul({4, C, largest, 8}));
  memory = add(memory, mul({2, L, D, 8}));
  for (size_t i = 0; i < o.sizes.size(); ++i) {
    // Samples cycle through the sizes: size i gets ceil((n - i) / sizes) of them.
    const auto n = static_cast<int64_t>(o.sizes.size()), index = static_cast<int64_t>(i);
    const int64_t count = add(num_samples - index, n - 1) / n;
    const int64_t sample = add(mul({add(mul({C, o.sizes[i].first, o.sizes[i].second}), add(mul({L, D}), P)), element}), 4096);
    disk = add(disk, mul({count, sample}));
  }
  if (overflow) return std::nullopt;
  return DemoBytes{memory, disk};
}

}  // namespace

LatentDataset make_demo_dataset(const std::string& dir, const LatentLayout& layout,
                                int64_t num_samples, uint64_t seed, const DemoDatasetOptions& options) {
  const int64_t multiple = layout.spatial_multiple;
  TORCH_CHECK_VALUE(num_samples >= 1, "[make_demo_dataset] num_samples must be >= 1, got ",
                    num_samples);
  TORCH_CHECK_VALUE(!options.sizes.empty(), "[make_demo_dataset] sizes must not be empty");
  for (const auto& [h, w] : options.sizes) {
    TORCH_CHECK_VALUE(h > 0 && w > 0 && h % multiple == 0 && w % multiple == 0,
                      "[make_demo_dataset] latent sizes must be > 0",
                      multiple > 1 ? " and multiples of " + std::to_string(multiple) + " for " + layout.family
                                   : std::string(),
                      ", got ", h, "x", w);
  }
  TORCH_CHECK_VALUE(options.text_tokens >= 1, "[make_demo_dataset] text_tokens must be >= 1, got ",
                    options.text_tokens);
  TORCH_CHECK_VALUE(options.text_tokens_min >= 0 && options.text_tokens_min <= options.text_tokens,
                    "[make_demo_dataset] text_tokens_min must be in [0, text_tokens = ",
                    options.text_tokens, "], got ", options.text_tokens_min);
  TORCH_CHECK_VALUE(options.joint_attention_dim >= 1,
                    "[make_demo_dataset] joint_attention_dim must be >= 1, got ",
                    options.joint_attention_dim);
  TORCH_CHECK_VALUE(!layout.pooled || options.pooled_projection_dim >= 1,
                    "[make_demo_dataset] pooled_projection_dim must be >= 1, got ",
                    options.pooled_projection_dim);
  TORCH_CHECK_VALUE(options.concept_dim >= 1, "[make_demo_dataset] concept_dim must be >= 1, got ",
                    options.concept_dim);
  TORCH_CHECK_VALUE(options.num_captions >= 0, "[make_demo_dataset] num_captions must be >= 0, got ",
                    options.num_captions);
  TORCH_CHECK_VALUE(options.noise_std >= 0.0, "[make_demo_dataset] noise_std must be >= 0, got ",
                    options.noise_std);
  TORCH_CHECK_VALUE(at::isFloatingType(options.dtype),
                    "[make_demo_dataset] dtype must be floating point, got ", options.dtype);

  // Sizes that cannot fit are refused before anything is allocated or written.
  const auto bytes = demo_dataset_bytes(layout, num_samples, options);
  TORCH_CHECK_VALUE(bytes.has_value(), "[make_demo_dataset] the sizes (", num_samples, " samples, text_tokens ",
                    options.text_tokens, ", joint_attention_dim ", options.joint_attention_dim,
                    ", latent sizes up to the largest given) overflow int64 bytes; use smaller sizes");
  const int64_t available = memory::available_bytes(at::Device(at::kCPU));
  TORCH_CHECK_VALUE(bytes->memory <= available, "[make_demo_dataset] generating these samples needs about ",
                    memory::format_bytes(bytes->memory), " of memory (text_tokens x concept_dim x joint_attention_dim "
                    "float64 maps, latent patterns), but ", memory::format_bytes(available),
                    " is available; use smaller sizes");
  std::error_code ec;
  fs::create_directories(dir, ec);
  TORCH_CHECK(!ec, "[make_demo_dataset] cannot create directory '", dir, "': ", ec.message());
  const auto space = fs::space(dir, ec);
  TORCH_CHECK_VALUE(ec || static_cast<uintmax_t>(bytes->disk) <= space.available, "[make_demo_dataset] the ",
                    num_samples, " samples need about ", memory::format_bytes(bytes->disk), " on disk, but '", dir,
                    "' has ", memory::format_bytes(static_cast<int64_t>(std::min<uintmax_t>(space.available, INT64_MAX))),
                    " free; use fewer or smaller samples");
  for (const auto& entry : fs::directory_iterator(dir)) {
    // Stale samples from an earlier run would silently join the new dataset.
    TORCH_CHECK(entry.path().extension() != ".safetensors", "[make_demo_dataset] directory '", dir,
                "' already holds sample files (e.g. '", entry.path().string(),
                "'); use an empty directory");
  }

  const int64_t k = options.concept_dim;
  const int64_t L = options.text_tokens;
  const int64_t D = options.joint_attention_dim;
  const int64_t P = options.pooled_projection_dim;
  const int64_t C = layout.channels;
  const int64_t captions = options.num_captions > 0 ? options.num_captions : num_samples;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);

  // The fixed "world": linear maps from the caption code to embeddings and latent patterns.
  auto world = make_generator(mix(seed, 0x5EED));
  const auto token_base = at::randn({k, D}, world, f64);
  const auto token_maps = token_base.unsqueeze(0) + 0.5 * at::randn({L, k, D}, world, f64);
  const auto pooled_map = at::randn({k, P}, world, f64);
  // (k, C, 9) coefficients of the 9 cosine patterns; 1/3 gives unit variance per pixel on average.
  const auto coefficients = at::randn({k, C, 9}, world, f64) / 3.0;
  const auto codes = at::randn({captions, k}, world, f64);
  const auto lengths =
      (layout.variable_text_length && options.text_tokens_min > 0)
          ? at::randint(options.text_tokens_min, L + 1, {captions}, world, at::kLong)
          : at::full({captions}, L, at::kLong);

  std::vector<at::Tensor> patterns;  // per size: (9, H*W)
  for (const auto& [h, w] : options.sizes) patterns.push_back(cosine_patterns(h, w).view({9, h * w}));

  const double inv_sqrt_k = 1.0 / std::sqrt(static_cast<double>(k));
  for (int64_t i = 0; i < num_samples; ++i) {
    const int64_t c = i % captions;
    const auto [h, w] = options.sizes[i % options.sizes.size()];
    const auto z = codes[c];  // (k)
    const int64_t length = lengths[c].item<int64_t>();
    // prompt_embeds[l] = z W_l / sqrt(k): (L, D)
    const auto prompt = at::einsum("k,lkd->ld", {z, token_maps.slice(0, 0, length)}) * inv_sqrt_k;
    // latents = sum_j z_j sum_f coef[j, c, f] pattern_f / sqrt(k), plus noise: (C, H, W)
    const auto mixing = at::einsum("k,kcf->cf", {z, coefficients}) * inv_sqrt_k;  // (C, 9)
    auto noise_gen = make_generator(mix(seed, 0x40000000ull + static_cast<uint64_t>(i)));
    const auto latents = at::matmul(mixing, patterns[i % patterns.size()]).view({C, h, w}) +
                         options.noise_std * at::randn({C, h, w}, noise_gen, f64);

    std::vector<io::NamedTensor> entries = {{kLatents, latents.to(options.dtype)},
                                            {kPromptEmbeds, prompt.to(options.dtype)}};
    if (layout.pooled) entries.emplace_back(kPooled, (at::matmul(z, pooled_map) * inv_sqrt_k).to(options.dtype));
    char name[64];
    std::snprintf(name, sizeof(name), "sample_%06lld.safetensors", static_cast<long long>(i));
    io::save_safetensors((fs::path(dir) / name).string(), entries,
                         {{"remat.family", layout.family},
                          {"remat.demo_seed", std::to_string(seed)},
                          {"remat.caption_index", std::to_string(c)}});
  }
  return LatentDataset::open(dir, layout);
}

}  // namespace remat::train
