// `remat train` on folders of pictures: the datasets scanned, the caches built (and reused by the
// next run), the encoders freed and the transformer trained on the cached samples; and the
// image-run errors, raised before any model is loaded.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "remat/encoders/demo_pipeline.h"
#include "remat/image/image_file.h"
#include "remat/image/png_file.h"
#include "remat/train/options/config.h"
#include "remat/train/data/image_data.h"
#include "remat/train/run/trainer.h"
#include "train/quiet_hooks.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::train {
namespace {
namespace cache_trainer_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::TempDir;

// A picture whose colour the caption (its file name) names.
void write_picture(const std::string& path, int64_t width, int64_t height, int r, int g, int b) {
  fs::create_directories(fs::path(path).parent_path());
  auto picture = at::empty({height, width, 3}, at::kByte);
  picture.select(2, 0).fill_(r);
  picture.select(2, 1).fill_(g);
  picture.select(2, 2).fill_(b);
  picture.slice(0, height / 4, height / 2).slice(1, width / 4, width / 2).fill_(255 - r);
  image::write_png(path, picture);
}

class CacheTrainer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pipeline_ = std::make_unique<TempDir>("cache_trainer_pipeline");
    encoders::write_demo_pipeline(pipeline_->str(), {});
  }
  static void TearDownTestSuite() { pipeline_.reset(); }

  void SetUp() override {
    write_picture(dir_ / "images/a red square.png", 32, 32, 220, 10, 10);
    write_picture(dir_ / "images/a green square.png", 32, 32, 10, 220, 10);
    write_picture(dir_ / "images/wide/a blue band.png", 64, 32, 10, 10, 220);
    write_picture(dir_ / "images/wide/a grey band.png", 64, 32, 120, 120, 120);
  }

  TrainConfig config(const std::string& output, std::vector<std::string> extra) const {
    std::vector<std::string> args{"--model_family=flux", "--model_flavour=flux-tiny", "--model_type=lora",
                                  "--pretrained_model_name_or_path=" + pipeline_->str(),
                                  "--output_dir=" + dir_ / output, "--cache_dir=" + dir_ / "cache",
                                  "--train_batch_size=2", "--resolution=32", "--resolution_type=pixel",
                                  "--mixed_precision=no", "--seed=3", "--checkpointing_steps=0",
                                  "--max_train_steps=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<std::string> warnings;
    return load_train_config(args, warnings);
  }

  static std::unique_ptr<TempDir> pipeline_;
  TempDir dir_{"cache_trainer"};
};

std::unique_ptr<TempDir> CacheTrainer::pipeline_;

TEST_F(CacheTrainer, TrainsTwoStepsOnAFolderOfPicturesAndReusesTheCacheNextTime) {
  std::vector<std::string> lines;
  auto hooks = remat::testing::quiet_hooks();
  hooks.log = [&](const std::string& line) { lines.push_back(line); };
  const auto cfg = config("run1", {"--instance_data_dir=" + dir_ / "images", "--caption_dropout_probability=0.5"});
  EXPECT_TRUE(is_image_run(cfg));
  const auto result = run_training(cfg, hooks);
  ASSERT_EQ(result.final_step, 2);
  ASSERT_EQ(result.records.size(), 2u);
  for (const auto& record : result.records) EXPECT_TRUE(std::isfinite(record.loss));
  EXPECT_TRUE(fs::is_regular_file(result.weights_path));
  // One latents entry per picture under CACHE_DIR/vae/<model family>/<dataset id> (SimpleTuner's
  // layout), named by its relative path.
  EXPECT_TRUE(fs::is_regular_file(dir_ / "cache/vae/flux/instance_data_dir/wide/a blue band.png.safetensors"));
  const auto has = [&](const std::string& text) {
    for (const auto& line : lines) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("bucket 32x32: 2 image(s)")) << "per-bucket counts are printed";
  EXPECT_TRUE(has("bucket 64x32: 2 image(s)"));
  EXPECT_TRUE(has("VAE latents: 4 encoded"));
  EXPECT_TRUE(has("text embeddings: 5 encoded"));  // four captions and the empty one

  lines.clear();
  const auto again = run_training(config("run2", {"--instance_data_dir=" + dir_ / "images"}), hooks);
  EXPECT_EQ(again.final_step, 2);
  EXPECT_TRUE(has("VAE latents: 0 encoded")) << "the second run reuses every entry";
  EXPECT_TRUE(has("text embeddings: 0 encoded"));
}

// An image run resumes exactly: 3 steps, a stop, and 3 more give the losses of 6 steps in one run
// (epochs of 2 batches, so the resumed part crosses epochs and caption dropout draws).
TEST_F(CacheTrainer, AnImageRunResumesExactly) {
  const std::vector<std::string> extra = {"--instance_data_dir=" + dir_ / "images", "--caption_dropout_probability=0.3",
                                          "--max_train_steps=6"};
  const auto once = run_training(config("once", extra), remat::testing::quiet_hooks());
  ASSERT_EQ(once.final_step, 6);
  std::atomic<bool> stop{false};
  auto hooks = remat::testing::quiet_hooks();
  hooks.stop_requested = &stop;
  hooks.on_step = [&](const StepRecord& r) {
    if (r.step == 3) stop = true;
  };
  const auto first = run_training(config("split", extra), hooks);
  ASSERT_TRUE(first.interrupted);
  const auto second = run_training(config("split", extra), remat::testing::quiet_hooks());
  ASSERT_EQ(second.records.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(second.records[i].loss, once.records[3 + i].loss) << "step " << 4 + i;
}

TEST_F(CacheTrainer, TrainsOnSeveralDatasetsOfAMultidatabackendFile) {
  const std::string json = dir_ / "multidatabackend.json";
  std::ofstream(json) << R"([
    {"id": "squares", "type": "local", "instance_data_dir": ")" << dir_ / "images" << R"(",
     "resolution": 32, "resolution_type": "pixel", "repeats": 1, "probability": 1,
     "cache_dir_vae": ")" << dir_ / "cache/vae-squares" << R"("},
    {"id": "more", "type": "local", "instance_data_dir": ")" << dir_ / "images/wide" << R"(",
     "resolution": 32, "resolution_type": "pixel", "probability": 2, "caption_dropout_probability": 0.2},
    {"id": "text", "dataset_type": "text_embeds", "default": true, "type": "local",
     "cache_dir": ")" << dir_ / "cache/text" << R"("}
  ])";
  const auto result =
      run_training(config("multi", {"--data_backend_config=" + json, "--max_train_steps=3"}), remat::testing::quiet_hooks());
  EXPECT_EQ(result.final_step, 3);
  EXPECT_TRUE(fs::is_directory(dir_ / "cache/vae-squares"));
}

TEST_F(CacheTrainer, ALatentCacheInstanceDataDirWinsOverDataBackendConfig) {
  TrainConfig cfg;
  cfg.data_backend_config = dir_ / "multidatabackend.json";
  EXPECT_TRUE(is_image_run(cfg));
  cfg.instance_data_dir = dir_ / "images";  // pictures: the backends describe the data
  EXPECT_TRUE(is_image_run(cfg));
  make_demo_dataset(dir_ / "latents", LatentLayout{"flux", 16, 2, true, false}, 1, 0);
  cfg.instance_data_dir = dir_ / "latents";
  EXPECT_FALSE(is_image_run(cfg));
  cfg.data_backend_config.reset();
  EXPECT_FALSE(is_image_run(cfg));
  cfg.instance_data_dir = dir_ / "images";
  EXPECT_TRUE(is_image_run(cfg));
}

TEST_F(CacheTrainer, AnUnsupportedBackendTypeFailsBeforeAnyModelLoads) {
  const std::string json = dir_ / "multidatabackend.json";
  std::ofstream(json) << R"([{"id": "in-the-cloud", "type": "aws", "aws_bucket_name": "b"}])";
  // The pipeline folder does not exist: the backend error comes first, so nothing was loaded.
  auto cfg = config("bad", {"--data_backend_config=" + json});
  cfg.pretrained_model_name_or_path = dir_ / "no-such-pipeline";
  const auto message = remat::testing::error_of([&] { run_training(cfg, remat::testing::quiet_hooks()); });
  EXPECT_NE(message.find("in-the-cloud"), std::string::npos) << message;
  EXPECT_NE(message.find("aws"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(dir_ / "bad/metrics.jsonl"));
}

TEST_F(CacheTrainer, ClearErrorsForWhatAnImageRunCannotUse) {
  // The model source must be a pipeline folder with the encoders.
  auto cfg = config("nopipe", {"--instance_data_dir=" + dir_ / "images"});
  cfg.pretrained_model_name_or_path.reset();
  auto message = remat::testing::error_of([&] { run_training(cfg, remat::testing::quiet_hooks()); });
  EXPECT_NE(message.find("pretrained_model_name_or_path"), std::string::npos) << message;
  EXPECT_NE(message.find("pipeline folder"), std::string::npos) << message;

  // MageFlow without a pipeline folder: told how to make one.
  std::vector<std::string> warnings;
  const auto mageflow = load_train_config({"--model_family=mageflow", "--model_flavour=mageflow-tiny",
                                           "--instance_data_dir=" + dir_ / "images", "--output_dir=" + dir_ / "mf"},
                                          warnings);
  message = remat::testing::error_of([&] { run_training(mageflow, remat::testing::quiet_hooks()); });
  EXPECT_NE(message.find("pretrained_model_name_or_path"), std::string::npos) << message;
  EXPECT_NE(message.find("make-demo-pipeline --model_family mageflow"), std::string::npos) << message;

  // Nothing usable: every picture is corrupt.
  fs::create_directories(dir_ / "broken");
  std::ofstream(dir_ / "broken/a.png") << "not a picture";
  message = remat::testing::error_of(
      [&] { run_training(config("broken", {"--instance_data_dir=" + dir_ / "broken"}), remat::testing::quiet_hooks()); });
  EXPECT_NE(message.find("no usable image"), std::string::npos) << message;
}

}  // namespace cache_trainer_test
}  // namespace
}  // namespace remat::train
