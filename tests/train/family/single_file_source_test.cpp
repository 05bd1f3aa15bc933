// SimpleTuner's single-file transformer: pretrained_transformer_model_name_or_path naming one
// .safetensors file, in Black Forest Labs' layout or diffusers', next to a pipeline folder (whose
// transformer config.json gives the shapes) or alone (a BFL file's shapes give them).
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/flux_formats_test_util.h"
#include "remat/encoders/demo_pipeline.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/io/safetensors.h"
#include "remat/models/flux.h"
#include "remat/train/options/config.h"
#include "remat/train/data/data.h"
#include "remat/train/family/family.h"
#include "remat/train/family/model_source.h"
#include "remat/train/run/trainer.h"
#include "train/quiet_hooks.h"
#include "temp_dir.h"
#include "value_error.h"
#include "flux_tiny_dataset.h"

namespace remat::train {
namespace {
namespace single_file_source_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::quiet_hooks;

class SingleFileSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    remat::testing::make_flux_tiny_dataset(dir_ / "data", 4);
    encoders::DemoPipelineOptions pipe;
    pipe.seed = 99;  // the folder's own transformer must not be the one trained
    encoders::write_demo_pipeline(dir_ / "pipe", pipe);
    // The transformer to train: random flux-tiny weights in the BFL layout (the test's converter).
    source_ = models::test::random_flux(models::FluxConfig::preset("flux-tiny"), 5);
    io::save_safetensors(dir_ / "flux1-tiny.safetensors",
                         models::test::test_diffusers_to_bfl(models::test::diffusers_state(*source_),
                                                             source_->config()));
  }

  // flux-small as the flavour: only flux-tiny shapes fit the data, so a run that trains proves the
  // shapes came from the folder's config or the file. learning_rate 0: the saved weights are the
  // weights loaded.
  TrainConfig config(const std::string& output, std::vector<std::string> extra) {
    std::vector<std::string> args{"--model_family=flux", "--model_flavour=flux-small", "--model_type=full",
                                  "--instance_data_dir=" + dir_ / "data", "--output_dir=" + dir_ / output,
                                  "--train_batch_size=2", "--learning_rate=0", "--optimizer=torch-adamw",
                                  "--lr_scheduler=constant", "--mixed_precision=no", "--seed=3",
                                  "--checkpointing_steps=0", "--max_train_steps=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<std::string> warnings;
    return load_train_config(args, warnings);
  }

  void expect_trained_from_file(const TrainResult& result) {
    ASSERT_EQ(result.final_step, 2);
    const auto saved = io::SafetensorsFile::open(result.weights_path);
    const auto want = models::test::diffusers_state(*source_);
    ASSERT_EQ(saved.names().size(), want.size());
    for (const auto& [name, tensor] : want) EXPECT_TRUE(torch::equal(saved.tensor(name), tensor)) << name;
  }

  remat::testing::TempDir dir_{"remat_single_file_source"};
  models::Flux source_{nullptr};
};

TEST_F(SingleFileSourceTest, BflFileNextToAPipelineFolder) {
  const auto cfg = config("with-pipe", {"--pretrained_model_name_or_path=" + dir_ / "pipe",
                                        "--pretrained_transformer_model_name_or_path=" + dir_ / "flux1-tiny.safetensors"});
  const ModelSource source = resolve_model_source(cfg);
  EXPECT_EQ(source.weights.value_or(""), dir_ / "flux1-tiny.safetensors");
  EXPECT_EQ(source.config_json.value_or(""), dir_ / "pipe/transformer/config.json");
  expect_trained_from_file(run_training(cfg, quiet_hooks()));
}

TEST_F(SingleFileSourceTest, BflFileAloneTakesItsShapesFromTheFile) {
  const auto cfg = config("alone", {"--pretrained_model_name_or_path=black-forest-labs/FLUX.1-dev",
                                    "--pretrained_transformer_model_name_or_path=" + dir_ / "flux1-tiny.safetensors"});
  const ModelSource source = resolve_model_source(cfg);
  EXPECT_EQ(source.weights.value_or(""), dir_ / "flux1-tiny.safetensors");
  EXPECT_FALSE(source.config_json.has_value());
  expect_trained_from_file(run_training(cfg, quiet_hooks()));
}

TEST_F(SingleFileSourceTest, BadSingleFileSourcesAreNamed) {
  std::string msg = remat::testing::error_of([&] {
    resolve_model_source(config("x", {"--pretrained_transformer_model_name_or_path=" + dir_ / "flux1-tiny.safetensors",
                                      "--pretrained_transformer_subfolder=transformer"}));
  });
  EXPECT_NE(msg.find("a single .safetensors file"), std::string::npos) << msg;
  msg = remat::testing::error_of([&] {
    resolve_model_source(config("x", {"--pretrained_transformer_model_name_or_path=" + dir_ / "missing.safetensors"}));
  });
  EXPECT_NE(msg.find("missing.safetensors"), std::string::npos) << msg;
}

}  // namespace single_file_source_test
}  // namespace
}  // namespace remat::train
