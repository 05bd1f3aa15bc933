// Tests of the latent-cache dataset, the shape-bucketed batch sampler and the demo data.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <numeric>
#include <set>

#include "remat/io/safetensors.h"
#include "remat/train/data/data.h"
#include "remat/train/family/family.h"
#include "temp_dir.h"

using remat::train::LatentDataset;

namespace {
namespace data_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(0); }
  std::string sub(const std::string& name) const { return dir_ / name; }

  remat::testing::TempDir dir_{"remat_data"};
};

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    for (const auto& needle : needles) {
      EXPECT_NE(msg.find(needle), std::string::npos) << "message lacks '" << needle << "':\n" << msg;
    }
    return;
  }
  ADD_FAILURE() << "expected an error";
}

remat::train::DemoDatasetOptions small_flux() {
  remat::train::DemoDatasetOptions o;
  o.sizes = {{8, 8}};
  o.text_tokens = 6;
  o.joint_attention_dim = 16;
  o.pooled_projection_dim = 12;
  return o;
}

TEST_F(DataTest, FluxDemoRoundTripsThroughTheDataset) {
  remat::train::DemoDatasetOptions o;  // defaults: 16x16 latents, L = 32, D = 64, P = 32
  const auto made = remat::train::make_demo_dataset(sub("flux"), remat::train::model_family("flux").latents, 3, 7, o);
  const auto ds = LatentDataset::open(sub("flux"), remat::train::model_family("flux").latents);
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(made.size(), 3);
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto s = ds.get(i);
    EXPECT_EQ(s.latents.sizes().vec(), (std::vector<int64_t>{16, 16, 16}));
    EXPECT_EQ(s.prompt_embeds.sizes().vec(), (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(s.pooled_prompt_embeds.sizes().vec(), (std::vector<int64_t>{32}));
    EXPECT_EQ(s.latents.scalar_type(), torch::kFloat);
    EXPECT_EQ(s.path, ds.path(i));
    // The dataset returns exactly what is in the file.
    const auto file = remat::io::SafetensorsFile::open(ds.path(i));
    EXPECT_TRUE(torch::equal(s.latents, file.tensor("latents")));
    EXPECT_EQ(file.metadata().at("remat.family"), "flux");
  }
  // Sorted by file name.
  EXPECT_LT(ds.path(0), ds.path(1));
  EXPECT_EQ(fs::path(ds.path(0)).filename(), "sample_000000.safetensors");

  // Same seed → same bytes; different seed → different data.
  remat::train::make_demo_dataset(sub("again"), remat::train::model_family("flux").latents, 3, 7, o);
  remat::train::make_demo_dataset(sub("other"), remat::train::model_family("flux").latents, 3, 8, o);
  const auto again = LatentDataset::open(sub("again"), remat::train::model_family("flux").latents);
  const auto other = LatentDataset::open(sub("other"), remat::train::model_family("flux").latents);
  EXPECT_TRUE(torch::equal(again.get(2).latents, ds.get(2).latents));
  EXPECT_TRUE(torch::equal(again.get(2).prompt_embeds, ds.get(2).prompt_embeds));
  EXPECT_FALSE(torch::allclose(other.get(2).latents, ds.get(2).latents));

  // A populated directory is refused rather than mixed with stale samples.
  expect_error([&] { remat::train::make_demo_dataset(sub("flux"), remat::train::model_family("flux").latents, 1, 0, o); },
               {"already holds sample files"});
}

TEST_F(DataTest, MageFlowDemoHasVariableTextLengthAndNoPooled) {
  remat::train::DemoDatasetOptions o;
  o.sizes = {{5, 7}};  // odd sizes are fine: MageFlow does not pack 2x2
  o.text_tokens = 9;
  o.text_tokens_min = 3;
  o.joint_attention_dim = 24;
  const auto ds = remat::train::make_demo_dataset(sub("mf"), remat::train::model_family("mageflow").latents, 12, 3, o);
  std::set<int64_t> lengths;
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto s = ds.get(i);
    EXPECT_EQ(s.latents.sizes().vec(), (std::vector<int64_t>{128, 5, 7}));
    EXPECT_EQ(s.prompt_embeds.size(1), 24);
    EXPECT_GE(s.prompt_embeds.size(0), 3);
    EXPECT_LE(s.prompt_embeds.size(0), 9);
    EXPECT_FALSE(s.pooled_prompt_embeds.defined());
    lengths.insert(s.prompt_embeds.size(0));
  }
  EXPECT_GT(lengths.size(), 1u) << "text lengths should vary";
  // A MageFlow cache is not a Flux cache (no pooled key, 128 channels).
  expect_error([&] { LatentDataset::open(sub("mf"), remat::train::model_family("flux").latents); },
               {"sample_000000.safetensors", "missing key 'pooled_prompt_embeds'"});
}

TEST_F(DataTest, EpochOrderIsDeterministicAndBucketed) {
  auto o = small_flux();
  o.sizes = {{8, 8}, {8, 4}, {4, 8}};  // three buckets of 7, 7 and 6 samples
  const auto ds = remat::train::make_demo_dataset(sub("b"), remat::train::model_family("flux").latents, 20, 1, o);
  const int64_t batch_size = 3;

  const auto e0 = ds.epoch_batches(42, 0, batch_size);
  EXPECT_EQ(e0, ds.epoch_batches(42, 0, batch_size)) << "same seed and epoch must repeat";
  EXPECT_NE(e0, ds.epoch_batches(42, 1, batch_size)) << "epochs must differ";
  EXPECT_NE(e0, ds.epoch_batches(43, 0, batch_size)) << "seeds must differ";
  EXPECT_NE(ds.epoch_batches(1, 0, batch_size), ds.epoch_batches(0, 1, batch_size));

  // The global RNG is neither used nor disturbed.
  torch::manual_seed(123);
  const auto before = torch::rand({1});
  torch::manual_seed(123);
  ds.epoch_batches(42, 0, batch_size);
  EXPECT_TRUE(torch::equal(torch::rand({1}), before));

  // Every sample exactly once; one shape per batch; sizes ceil(7/3) + ceil(7/3) + ceil(6/3).
  remat::train::BatchSampler sampler(ds.shapes(), batch_size);
  EXPECT_EQ(sampler.num_buckets(), 3);
  EXPECT_EQ(sampler.batches_per_epoch(), 3 + 3 + 2);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const auto batches = sampler.epoch(42, epoch);
    EXPECT_EQ(batches.size(), 8u);
    std::vector<int64_t> seen;
    int64_t partial = 0;
    for (const auto& batch : batches) {
      ASSERT_FALSE(batch.empty());
      EXPECT_LE(static_cast<int64_t>(batch.size()), batch_size);
      partial += static_cast<int64_t>(batch.size()) < batch_size;
      for (auto i : batch) {
        EXPECT_EQ(ds.shape(i), ds.shape(batch[0])) << "mixed shapes in one batch";
        seen.push_back(i);
      }
    }
    EXPECT_EQ(partial, 2) << "only the 7-sample buckets leave a partial batch";
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(20);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all);
  }

  // Batches stack to (B, ...) and match the individual samples.
  const auto& first = e0.front();
  const auto batch = ds.get_batch(first);
  EXPECT_EQ(batch.latents.size(0), static_cast<int64_t>(first.size()));
  EXPECT_EQ(batch.pooled_prompt_embeds.sizes().vec(),
            (std::vector<int64_t>{static_cast<int64_t>(first.size()), 12}));
  EXPECT_TRUE(torch::equal(batch.latents[0], ds.get(first[0]).latents));
  EXPECT_TRUE(torch::equal(batch.prompt_embeds.select(0, batch.indices.size() - 1),
                           ds.get(first.back()).prompt_embeds));
  expect_error([&] { ds.get_batch({0, 1}); }, {"one shape", "sample 1"});
  expect_error([&] { remat::train::BatchSampler(ds.shapes(), 0); }, {"batch_size must be >= 1, got 0"});
  expect_error([&] { ds.get(20); }, {"index must be in [0, 20), got 20"});
}

TEST_F(DataTest, CorruptSamplesNameTheFile) {
  const auto o = small_flux();
  const auto good = [&](const std::string& name) {
    remat::train::make_demo_dataset(sub(name), remat::train::model_family("flux").latents, 2, 0, o);
    return sub(name) + "/sample_000001.safetensors";
  };

  // Truncated file.
  const auto truncated = good("truncated");
  fs::resize_file(truncated, 20);
  expect_error([&] { LatentDataset::open(sub("truncated"), remat::train::model_family("flux").latents); },
               {truncated, "past the end of the file"});

  // Missing key.
  const auto missing = good("missing");
  remat::io::save_safetensors(missing, {{"latents", torch::zeros({16, 8, 8})},
                                        {"prompt_embeds", torch::zeros({6, 16})}});
  expect_error([&] { LatentDataset::open(sub("missing"), remat::train::model_family("flux").latents); },
               {missing, "missing key 'pooled_prompt_embeds'"});

  // Wrong rank.
  const auto rank = good("rank");
  remat::io::save_safetensors(rank, {{"latents", torch::zeros({16, 64})},
                                     {"prompt_embeds", torch::zeros({6, 16})},
                                     {"pooled_prompt_embeds", torch::zeros({12})}});
  expect_error([&] { LatentDataset::open(sub("rank"), remat::train::model_family("flux").latents); },
               {rank, "latents must have rank 3 (C, H, W), got shape [16, 64]"});

  // Wrong channel count, odd size, integer dtype, mismatched text width.
  const auto check = [&](const std::string& name, std::vector<remat::io::NamedTensor> entries,
                         std::vector<std::string> needles) {
    const auto p = good(name);
    remat::io::save_safetensors(p, entries);
    needles.push_back(p);
    expect_error([&] { LatentDataset::open(sub(name), remat::train::model_family("flux").latents); }, needles);
  };
  check("channels",
        {{"latents", torch::zeros({4, 8, 8})}, {"prompt_embeds", torch::zeros({6, 16})},
         {"pooled_prompt_embeds", torch::zeros({12})}},
        {"latents must have 16 channels", "[4, 8, 8]"});
  check("odd",
        {{"latents", torch::zeros({16, 7, 8})}, {"prompt_embeds", torch::zeros({6, 16})},
         {"pooled_prompt_embeds", torch::zeros({12})}},
        {"H and W must be even"});
  check("dtype",
        {{"latents", torch::zeros({16, 8, 8}, torch::kInt)}, {"prompt_embeds", torch::zeros({6, 16})},
         {"pooled_prompt_embeds", torch::zeros({12})}},
        {"latents must be floating point"});
  check("width",
        {{"latents", torch::zeros({16, 8, 8})}, {"prompt_embeds", torch::zeros({6, 17})},
         {"pooled_prompt_embeds", torch::zeros({12})}},
        {"prompt_embeds width D must match the first sample", "D = 16"});

  expect_error([&] { LatentDataset::open(sub("nowhere"), remat::train::model_family("flux").latents); },
               {"nowhere", "is not a directory"});
  fs::create_directories(sub("empty"));
  expect_error([&] { LatentDataset::open(sub("empty"), remat::train::model_family("flux").latents); },
               {"holds no .safetensors sample files"});
  expect_error([&] { remat::train::model_family("sd3"); }, {"flux, mageflow", "'sd3'"});
}

TEST_F(DataTest, LatentsDependOnTheEmbeddings) {
  auto o = small_flux();
  o.num_captions = 4;
  o.noise_std = 0.05;
  const auto ds = remat::train::make_demo_dataset(sub("pairs"), remat::train::model_family("flux").latents, 8, 5, o);
  for (int64_t i = 0; i < 4; ++i) {
    const auto a = ds.get(i), b = ds.get(i + 4);  // same caption
    EXPECT_TRUE(torch::equal(a.prompt_embeds, b.prompt_embeds));
    EXPECT_TRUE(torch::equal(a.pooled_prompt_embeds, b.pooled_prompt_embeds));
    const double same = (a.latents - b.latents).abs().max().item<double>();
    // Difference of two N(0, 0.05^2) draws over 1024 values: max well under 6 * 0.05 * sqrt(2).
    EXPECT_LT(same, 6 * 0.05 * std::sqrt(2.0));
    EXPECT_GT(same, 0.0) << "noise must be independent per sample";
    const auto c = ds.get((i + 1) % 4);  // a different caption
    EXPECT_FALSE(torch::equal(a.prompt_embeds, c.prompt_embeds));
    const double rms_diff = (a.latents - c.latents).pow(2).mean().sqrt().item<double>();
    EXPECT_GT(rms_diff, 10 * o.noise_std);
  }
}

TEST_F(DataTest, LatentsAreALinearFunctionOfTheFirstTokenUpToNoise) {
  // Independent check of the promised structure: least squares from prompt_embeds[0] (D = 16,
  // plus a bias) to the flattened latents leaves only the noise; the same fit against shuffled
  // embeddings does not.
  auto o = small_flux();
  o.noise_std = 0.05;
  const int64_t n = 64;
  const auto ds = remat::train::make_demo_dataset(sub("lin"), remat::train::model_family("flux").latents, n, 11, o);
  std::vector<at::Tensor> xs, ys;
  for (int64_t i = 0; i < n; ++i) {
    const auto s = ds.get(i);
    xs.push_back(torch::cat({s.prompt_embeds[0].to(torch::kDouble), torch::ones({1}, torch::kDouble)}));
    ys.push_back(s.latents.flatten().to(torch::kDouble));
  }
  const auto X = torch::stack(xs), Y = torch::stack(ys);  // (n, 17), (n, 1024)
  const auto fit_rms = [](const at::Tensor& x, const at::Tensor& y) {
    const auto w = at::linalg_pinv(x).matmul(y);
    return (x.matmul(w) - y).pow(2).mean().sqrt().item<double>();
  };
  const double residual = fit_rms(X, Y);
  const double signal = Y.pow(2).mean().sqrt().item<double>();
  // Residual of a least-squares fit with 17 parameters over 64 rows is about
  // noise * sqrt((64 - 17) / 64) = 0.043.
  EXPECT_LT(residual, 1.2 * o.noise_std) << "signal rms " << signal;
  EXPECT_GT(residual, 0.5 * o.noise_std);
  EXPECT_GT(signal, 0.3) << "latents must carry signal well above the noise";
  const auto shuffled = X.index_select(0, torch::randperm(n));
  EXPECT_GT(fit_rms(shuffled, Y), 0.5 * signal) << "pairing must matter";
}

}  // namespace data_test
}  // namespace
