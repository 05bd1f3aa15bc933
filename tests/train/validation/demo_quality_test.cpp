// The demo quality check's measure (remat/train/validation/demo_quality.h): captions parsed as the picture
// plan says, the latent feature against means computed here, the nearest-centroid classifier on
// points placed here, and the measure telling the classes of the demo's own cached training
// latents apart far above chance (the check that a "before vs after training" figure can mean
// anything).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include <ATen/ATen.h>

#include "remat/data/demo_images.h"
#include "remat/encoders/demo_pipeline.h"
#include "remat/train/options/config.h"
#include "remat/train/validation/demo_quality.h"
#include "remat/train/run/trainer.h"
#include "train/quiet_hooks.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::train {
namespace {
namespace demo_quality_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::TempDir;

TEST(DemoQuality, EveryDemoCaptionParsesToWhatThePicturePlanSays) {
  data::DemoImagesOptions options;
  options.count = 24;
  for (const auto& image : data::plan_demo_images(options)) {
    const auto caption = parse_demo_caption(image.caption);
    ASSERT_TRUE(caption.has_value()) << image.caption;
    EXPECT_EQ(caption->shape, image.shape);
    EXPECT_EQ(caption->colour, image.colour);
    EXPECT_EQ(caption->background, image.background);
    EXPECT_EQ(caption->get("colour"), image.colour);
  }
  EXPECT_FALSE(parse_demo_caption("a photo of a cat"));
  EXPECT_FALSE(parse_demo_caption("a purple circle on a white background"));
  EXPECT_FALSE(parse_demo_caption("a red circle on a white background please"));
}

TEST(DemoQuality, TheFeatureIsTheChannelMeansOfTheWholeLatentAndOfItsCentre) {
  const at::Tensor x = at::randn({3, 8, 6}, at::kFloat);
  const at::Tensor f = latent_feature(x);
  ASSERT_EQ(f.size(0), 6);
  auto a = x.accessor<float, 3>();
  for (int64_t c = 0; c < 3; ++c) {
    double all = 0, centre = 0;
    int64_t n_centre = 0;
    for (int64_t i = 0; i < 8; ++i) {
      for (int64_t j = 0; j < 6; ++j) {
        all += a[c][i][j];
        if (i >= 2 && i < 6 && j >= 1 && j < 4) {  // rows [8/4, 24/4), columns [6/4, 18/4)
          centre += a[c][i][j];
          ++n_centre;
        }
      }
    }
    EXPECT_NEAR(f[c].item<double>(), all / 48, 1e-6);
    EXPECT_NEAR(f[3 + c].item<double>(), centre / static_cast<double>(n_centre), 1e-6);
  }
  EXPECT_NE(remat::testing::error_of([] { latent_feature(at::zeros({3, 1, 6})); }).find("(C, h, w)"),
            std::string::npos);
}

TEST(DemoQuality, NearestCentroidNamesTheClassWhoseMeanIsNearest) {
  NearestCentroid classifier;
  classifier.add("a", at::tensor({0.0, 0.0}, at::kDouble));
  classifier.add("a", at::tensor({2.0, 0.0}, at::kDouble));  // mean (1, 0)
  classifier.add("b", at::tensor({4.0, 4.0}, at::kDouble));
  EXPECT_EQ(classifier.classes(), 2);
  EXPECT_EQ(classifier.classify(at::tensor({1.5, 0.5}, at::kDouble)), "a");
  EXPECT_EQ(classifier.classify(at::tensor({3.0, 3.0}, at::kDouble)), "b");
  EXPECT_NE(remat::testing::error_of([] { NearestCentroid().classify(at::zeros({2})); }).find("no classes"),
            std::string::npos);
}

// make demo's data at test size: the 72 pictures, a demo pipeline, the caches built as training
// builds them.
class DemoQualityData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>("demo_quality");
    data::write_demo_images(*dir_ / "images", {});
    encoders::DemoPipelineOptions pipeline;
    pipeline.transformer_preset = "flux-tiny";
    pipeline.dtype = "fp32";
    encoders::write_demo_pipeline(*dir_ / "pipeline", pipeline);
  }
  static void TearDownTestSuite() { dir_.reset(); }

  static TrainConfig config(std::vector<std::string> extra = {}) {
    std::vector<std::string> warnings;
    std::vector<std::string> args{"--model_family=flux", "--model_flavour=flux-tiny", "--model_type=lora",
                              "--pretrained_model_name_or_path=" + *dir_ / "pipeline",
                              "--instance_data_dir=" + *dir_ / "images", "--caption_strategy=textfile",
                              "--resolution=32", "--resolution_type=pixel", "--tokenizer_max_length=32",
                              "--cache_dir=" + *dir_ / "cache", "--output_dir=" + *dir_ / "out",
                              "--mixed_precision=no", "--seed=1", "--lora_rank=16"};
    args.insert(args.end(), extra.begin(), extra.end());
    return load_train_config(args, warnings);
  }

  static std::unique_ptr<TempDir> dir_;
};

std::unique_ptr<TempDir> DemoQualityData::dir_;

TEST_F(DemoQualityData, TheMeasureTellsTheTrainingLatentsClassesApartFarAboveChance) {
  const DemoTrainingData data = read_demo_training_data(config(), [](const std::string&) {});
  ASSERT_EQ(data.latents.size(), 72u);
  ASSERT_EQ(data.prompts.size(), 24u);
  // Leave-one-out: each latent classified by centroids of the other 71. The latents are
  // posterior samples of a random VAE, noisy, so the bars are "far above chance", not "perfect".
  EXPECT_GE(leave_one_out_accuracy(data.latents, "background"), 0.9);  // chance 0.5
  EXPECT_GE(leave_one_out_accuracy(data.latents, "colour"), 0.5);      // chance 0.25
  // A sample with a caption's own training latent as its "sample" is classified as that caption
  // far more often than chance too (what the sampled comparison relies on).
  EXPECT_GE(classified_accuracy(data.latents, data.latents, "colour"), 0.5);
  // The prompts are the demo's 24 captions, each with its cached embeddings.
  for (const auto& prompt : data.prompts) {
    EXPECT_TRUE(parse_demo_caption(prompt.caption).has_value()) << prompt.caption;
    EXPECT_EQ(prompt.prompt_embeds.dim(), 2);
    EXPECT_EQ(prompt.pooled_prompt_embeds.dim(), 1);
  }
  EXPECT_DOUBLE_EQ(mean_feature_distance({data.latents[0]}, {data.latents[0]}), 0.0);
}

TEST_F(DemoQualityData, AMissingLoraIsAClearError) {
  const std::string message =
      remat::testing::error_of([] { measure_demo_quality(config(), {}, [](const std::string&) {}); });
  EXPECT_NE(message.find("pytorch_lora_weights.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("make demo"), std::string::npos) << message;
}

// The whole loop at test size: train the demo's LoRA briefly, sample every caption from the base
// model and with the LoRA. The base transformer's samples lie far from the training latents; the
// trained LoRA's must have moved towards them (what the loss says, seen in the samples).
TEST_F(DemoQualityData, TrainingMovesTheSamplesTowardsTheTrainingLatents) {
  const TrainConfig cfg = config({"--max_train_steps=300", "--train_batch_size=4", "--learning_rate=3e-3",
                                  "--optimizer=torch-adamw", "--checkpointing_steps=0", "--torch_num_threads=1",
                                  "--flux_lora_target=all"});
  const auto result = run_training(cfg, remat::testing::quiet_hooks());
  ASSERT_EQ(result.final_step, 300);
  DemoQualityOptions options;
  options.seeds_per_caption = 1;
  options.num_inference_steps = 10;
  const DemoQualityReport report = measure_demo_quality(cfg, options, [](const std::string&) {});
  EXPECT_EQ(report.samples_per_model, 24);
  EXPECT_EQ(report.latent_size, 16);
  EXPECT_EQ(report.pixels, 32);  // through the demo VAE's factor 2
  ASSERT_EQ(report.scores.size(), 3u);
  EXPECT_DOUBLE_EQ(report.scores[0].chance, 0.25);
  std::printf("feature distance to the training mean: data %.3f, base %.3f, trained %.3f\n",
              report.distance_training, report.distance_untrained, report.distance_trained);
  EXPECT_LT(report.distance_trained, 0.7 * report.distance_untrained);
}

}  // namespace demo_quality_test
}  // namespace
}  // namespace remat::train
