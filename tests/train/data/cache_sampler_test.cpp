// MultiDataset: cached image samples (latents and caption embeddings in two files) from several
// datasets, with SimpleTuner's repeats and probability, full batches of one bucket, and caption
// dropout. Expected figures are derived from the documented policy, not read off the code.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "remat/io/safetensors.h"
#include "remat/train/data/data.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::train {
namespace {
namespace cache_sampler_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::TempDir;

const LatentLayout kFlux{"flux", 16, 2, true, false};

// Writes sample files: latents (16, h, w) filled with `value`, a caption file whose
// prompt_embeds (4, 8) are filled with `value` too (so a batch shows which files it read).
PairedSampleFiles write_sample(const TempDir& dir, const std::string& name, float value, int64_t h = 2,
                               int64_t w = 2) {
  PairedSampleFiles files{dir / (name + ".latents.safetensors"), dir / (name + ".text.safetensors")};
  io::save_safetensors(files.latents_path, {{"latents", at::full({16, h, w}, value)}});
  io::save_safetensors(files.text_path,
                       {{"prompt_embeds", at::full({4, 8}, value)}, {"pooled_prompt_embeds", at::full({6}, value)}});
  return files;
}

std::string write_empty_caption(const TempDir& dir) {
  const std::string path = dir / "empty.safetensors";
  io::save_safetensors(path, {{"prompt_embeds", at::full({4, 8}, -1.0f)}, {"pooled_prompt_embeds", at::full({6}, -1.0f)}});
  return path;
}

PairedDatasetSpec dataset(const TempDir& dir, const std::string& id, int64_t count, float first_value = 0) {
  PairedDatasetSpec spec;
  spec.id = id;
  for (int64_t i = 0; i < count; ++i) {
    spec.samples.push_back(write_sample(dir, id + std::to_string(i), first_value + static_cast<float>(i)));
  }
  return spec;
}

TEST(CacheSampler, RepeatsGiveExtraPassesAndRemaindersAreLeftOut) {
  TempDir dir;
  auto a = dataset(dir, "a", 6);
  a.repeats = 1;  // 12 occurrences -> 6 batches of 2, each sample exactly twice
  auto b = dataset(dir, "b", 5);  // 5 occurrences -> 2 batches, one sample left out
  const auto data = MultiDataset::open({a, b}, write_empty_caption(dir), kFlux, 2);
  EXPECT_EQ(data.batches_per_epoch(), 6 + 2);
  const auto epoch = data.epoch(7, 0);
  ASSERT_EQ(epoch.size(), 8u);
  std::map<int64_t, std::map<int64_t, int>> seen;  // dataset -> sample -> times
  for (const auto& batch : epoch) {
    ASSERT_EQ(batch.samples.size(), 2u);
    for (auto i : batch.samples) ++seen[batch.dataset][i];
  }
  ASSERT_EQ(seen[0].size(), 6u);
  for (const auto& [i, times] : seen[0]) EXPECT_EQ(times, 2) << "sample " << i;
  EXPECT_EQ(seen[1].size(), 4u);
  for (const auto& [i, times] : seen[1]) EXPECT_EQ(times, 1);
  // The left-out sample of b changes between epochs (shuffled each epoch).
  std::set<int64_t> left_out;
  for (int64_t e = 0; e < 20; ++e) {
    std::set<int64_t> used;
    for (const auto& batch : data.epoch(7, e)) {
      if (batch.dataset == 1) used.insert(batch.samples.begin(), batch.samples.end());
    }
    for (int64_t i = 0; i < 5; ++i) {
      if (!used.count(i)) left_out.insert(i);
    }
  }
  EXPECT_GT(left_out.size(), 1u);
}

TEST(CacheSampler, DeterministicPerSeedAndEpoch) {
  TempDir dir;
  auto a = dataset(dir, "a", 8);
  auto b = dataset(dir, "b", 6, 100);
  b.caption_dropout_probability = 0.5;
  const auto data = MultiDataset::open({a, b}, write_empty_caption(dir), kFlux, 2);
  const auto flatten = [](const std::vector<PlannedBatch>& batches) {
    std::vector<int64_t> out;
    for (const auto& batch : batches) {
      out.push_back(batch.dataset);
      out.insert(out.end(), batch.samples.begin(), batch.samples.end());
      out.insert(out.end(), batch.drop_caption.begin(), batch.drop_caption.end());
    }
    return out;
  };
  EXPECT_EQ(flatten(data.epoch(3, 1)), flatten(data.epoch(3, 1)));
  EXPECT_NE(flatten(data.epoch(3, 1)), flatten(data.epoch(3, 2)));
  EXPECT_NE(flatten(data.epoch(3, 1)), flatten(data.epoch(4, 1)));
  EXPECT_NE(flatten(data.epoch(1, 0)), flatten(data.epoch(0, 1)));
  // A reopened dataset plans the same epoch (nothing depends on process state).
  const auto again = MultiDataset::open({a, b}, write_empty_caption(dir), kFlux, 2);
  EXPECT_EQ(flatten(again.epoch(3, 1)), flatten(data.epoch(3, 1)));
  // Ranks split one epoch: rank r keeps batches r, r + W, ...
  const auto all = data.epoch(3, 1);
  const auto rank1 = data.epoch(3, 1, 1, 2);
  ASSERT_EQ(rank1.size(), all.size() / 2);
  for (size_t i = 0; i < rank1.size(); ++i) EXPECT_EQ(rank1[i].samples, all[2 * i + 1].samples);
}

TEST(CacheSampler, ProbabilityIsTheChanceABatchComesFromADataset) {
  TempDir dir;
  // 40 batches each; while both have batches left, b is drawn with chance 3 / (1 + 3).
  auto a = dataset(dir, "a", 40);
  auto b = dataset(dir, "b", 40, 100);
  a.probability = 1;
  b.probability = 3;
  const auto data = MultiDataset::open({a, b}, write_empty_caption(dir), kFlux, 1);
  int64_t from_b = 0, counted = 0;
  for (int64_t e = 0; e < 50; ++e) {
    const auto epoch = data.epoch(11, e);
    ASSERT_EQ(epoch.size(), 80u);  // every dataset is used in full each epoch
    // The first 20 batches: b cannot be exhausted yet (40 batches), so each is b with chance 3/4.
    for (size_t i = 0; i < 20; ++i) from_b += epoch[i].dataset == 1;
    counted += 20;
  }
  const double fraction = static_cast<double>(from_b) / static_cast<double>(counted);
  // 1000 Bernoulli(0.75) draws: standard deviation 0.0137; 4 sigma.
  EXPECT_NEAR(fraction, 0.75, 0.055);
  // probability 0: never drawn, not counted.
  a.probability = 0;
  const auto without_a = MultiDataset::open({a, b}, write_empty_caption(dir), kFlux, 1);
  EXPECT_EQ(without_a.batches_per_epoch(), 40);
  for (const auto& batch : without_a.epoch(11, 0)) EXPECT_EQ(batch.dataset, 1);
}

TEST(CacheSampler, CaptionDropoutRateAndEmbeddings) {
  TempDir dir;
  auto a = dataset(dir, "a", 20, 1);  // values 1..20, never -1
  a.caption_dropout_probability = 0.25;
  const auto data = MultiDataset::open({a}, write_empty_caption(dir), kFlux, 4);
  int64_t dropped = 0, total = 0;
  for (int64_t e = 0; e < 100; ++e) {
    for (const auto& batch : data.epoch(5, e)) {
      for (auto d : batch.drop_caption) dropped += d;
      total += static_cast<int64_t>(batch.drop_caption.size());
    }
  }
  ASSERT_EQ(total, 2000);
  // 2000 Bernoulli(0.25) draws: standard deviation 0.0097; 4 sigma.
  EXPECT_NEAR(static_cast<double>(dropped) / total, 0.25, 0.04);

  // A dropped sample reads the empty caption's embeddings; its latents stay its own.
  PlannedBatch planned{0, {3, 7}, {1, 0}};
  const auto batch = data.get_batch(planned);
  EXPECT_TRUE(batch.latents[0].eq(4.0f).all().item<bool>());
  EXPECT_TRUE(batch.prompt_embeds[0].eq(-1.0f).all().item<bool>());
  EXPECT_TRUE(batch.pooled_prompt_embeds[0].eq(-1.0f).all().item<bool>());
  EXPECT_TRUE(batch.prompt_embeds[1].eq(8.0f).all().item<bool>());
  EXPECT_TRUE(batch.latents[1].eq(8.0f).all().item<bool>());
}

TEST(CacheSampler, EveryBatchIsOneBucketOfOneDataset) {
  TempDir dir;
  PairedDatasetSpec a{"a", {}, 0, 1.0, 0};
  for (int i = 0; i < 6; ++i) a.samples.push_back(write_sample(dir, "s" + std::to_string(i), i, 2, i % 2 ? 4 : 2));
  const auto data = MultiDataset::open({a}, write_empty_caption(dir), kFlux, 3);
  EXPECT_EQ(data.bucket_shapes().size(), 2u);
  EXPECT_EQ(data.batches_per_epoch(), 2);
  for (const auto& planned : data.epoch(0, 0)) {
    const auto batch = data.get_batch(planned);
    EXPECT_EQ(batch.latents.sizes().vec(), (std::vector<int64_t>{3, 16, 2, planned.samples[0] % 2 ? 4 : 2}));
    for (auto i : planned.samples) EXPECT_EQ(i % 2, planned.samples[0] % 2);
  }
}

TEST(CacheSampler, ABucketThatCannotFillABatchIsRefusedWithTheRepeatsNeeded) {
  TempDir dir;
  auto a = dataset(dir, "portraits", 3);
  // 3 samples, batch 4: ceil(4 / 3) - 1 = 1 repeat fills one (SimpleTuner's figure).
  const auto message = remat::testing::error_of(
      [&] { MultiDataset::open({a}, write_empty_caption(dir), kFlux, 4); });
  EXPECT_NE(message.find("dataset 'portraits'"), std::string::npos) << message;
  EXPECT_NE(message.find("set repeats to at least 1"), std::string::npos) << message;
  a.repeats = 1;
  EXPECT_EQ(MultiDataset::open({a}, write_empty_caption(dir), kFlux, 4).batches_per_epoch(), 1);
}

TEST(CacheSampler, BadFilesAndSettingsAreNamed) {
  TempDir dir;
  auto a = dataset(dir, "a", 2);
  io::save_safetensors(dir / "bad.safetensors", {{"latents", at::zeros({8, 2, 2})}});
  auto bad = a;
  bad.samples[1].latents_path = dir / "bad.safetensors";
  auto message = remat::testing::error_of([&] { MultiDataset::open({bad}, write_empty_caption(dir), kFlux, 1); });
  EXPECT_NE(message.find("bad.safetensors"), std::string::npos) << message;
  bad = a;
  bad.probability = -1;
  message = remat::testing::error_of([&] { MultiDataset::open({bad}, write_empty_caption(dir), kFlux, 1); });
  EXPECT_NE(message.find("probability"), std::string::npos) << message;
  // A different empty-caption shape is refused when dropout would swap them.
  io::save_safetensors(dir / "short.safetensors", {{"prompt_embeds", at::zeros({3, 8})}, {"pooled_prompt_embeds", at::zeros({6})}});
  bad = a;
  bad.caption_dropout_probability = 0.1;
  message = remat::testing::error_of([&] { MultiDataset::open({bad}, dir / "short.safetensors", kFlux, 1); });
  EXPECT_NE(message.find("empty caption"), std::string::npos) << message;
}

}  // namespace cache_sampler_test
}  // namespace
}  // namespace remat::train
