// remat train with a diffusers pipeline folder (or a transformer folder, or SimpleTuner's
// transformer override) as pretrained_model_name_or_path: the weights trained are the folder's.
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

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
#include "variant_folder.h"

namespace remat::train {
namespace {
namespace pipeline_source_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::quiet_hooks;
namespace fs = std::filesystem;
using remat::testing::error_of;

class PipelineSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    remat::testing::make_flux_tiny_dataset(dir_ / "data", 4);
    encoders::DemoPipelineOptions pipe;
    pipe.seed = 11;
    pipe.transformer_shards = 2;
    encoders::write_demo_pipeline(dir_ / "pipe", pipe);
  }

  // flux-small as the flavour: the dataset fits only flux-tiny, so a run that trains proves the
  // architecture came from the folder's config.json. learning_rate 0: the weights saved at the
  // end are the weights loaded.
  TrainConfig config(const std::string& output, std::vector<std::string> extra) {
    std::vector<std::string> args{"--model_family=flux", "--model_flavour=flux-small", "--model_type=full",
                                  "--instance_data_dir=" + dir_ / "data", "--output_dir=" + dir_ / output,
                                  "--train_batch_size=2", "--learning_rate=0", "--optimizer=torch-adamw", "--lr_scheduler=constant",
                                  "--mixed_precision=no", "--seed=3", "--checkpointing_steps=0",
                                  "--max_train_steps=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<std::string> warnings;
    return load_train_config(args, warnings);
  }

  // The saved transformer equals the folder's bf16 weights converted to float32, key by key.
  void expect_trained_from_folder(const TrainResult& result) {
    ASSERT_EQ(result.final_step, 2);
    ASSERT_EQ(result.records.size(), 2u);
    const auto shards = models::open_component_weights(dir_ / "pipe/transformer");
    const auto saved = io::SafetensorsFile::open(result.weights_path);
    size_t compared = 0;
    for (const auto& shard : shards) {
      for (const auto& name : shard.names()) {
        EXPECT_EQ(shard.info(name).dtype, at::kBFloat16) << name;
        EXPECT_TRUE(torch::equal(saved.tensor(name, at::kFloat), shard.tensor(name, at::kFloat))) << name;
        ++compared;
      }
    }
    EXPECT_EQ(static_cast<int64_t>(compared), models::state_dict_key_count(models::FluxConfig::preset("flux-tiny")));
  }

  remat::testing::TempDir dir_{"remat_pipeline_source"};
};

TEST_F(PipelineSourceTest, TrainsTwoStepsFromAPipelineFolder) {
  const auto cfg = config("from-pipe", {"--pretrained_model_name_or_path=" + dir_ / "pipe"});
  const ModelSource source = resolve_model_source(cfg);
  EXPECT_EQ(source.weights.value_or(""), dir_ / "pipe/transformer");
  EXPECT_EQ(source.config_json.value_or(""), dir_ / "pipe/transformer/config.json");
  expect_trained_from_folder(run_training(cfg, quiet_hooks()));
}

TEST_F(PipelineSourceTest, TrainsFromATransformerFolderAlone) {
  expect_trained_from_folder(
      run_training(config("from-folder", {"--pretrained_model_name_or_path=" + dir_ / "pipe/transformer"}),
                   quiet_hooks()));
}

TEST_F(PipelineSourceTest, TransformerOverrideWinsOverTheFolder) {
  encoders::DemoPipelineOptions other;
  other.seed = 99;  // different weights: the run must not take them
  encoders::write_demo_pipeline(dir_ / "other", other);
  const auto cfg = config("override", {"--pretrained_model_name_or_path=" + dir_ / "other",
                                       "--pretrained_transformer_model_name_or_path=" + dir_ / "pipe",
                                       "--pretrained_transformer_subfolder=transformer"});
  EXPECT_EQ(resolve_model_source(cfg).weights.value_or(""), dir_ / "pipe/transformer");
  expect_trained_from_folder(run_training(cfg, quiet_hooks()));
}

// --variant (SimpleTuner's, diffusers' variant=): a folder of fp16 files trains from them, and
// without the option its error says how to read them.
TEST_F(PipelineSourceTest, AVariantFolderTrainsWithItsVariant) {
  remat::testing::copy_as_variant(dir_ / "pipe", dir_ / "pipe-fp16", "fp16");
  const auto cfg = config("variant", {"--pretrained_model_name_or_path=" + dir_ / "pipe-fp16", "--variant=fp16"});
  EXPECT_EQ(transformer_spec_of(cfg, resolve_model_source(cfg)).variant, "fp16");
  expect_trained_from_folder(run_training(cfg, quiet_hooks()));
  const std::string msg = error_of([&] {
    resolve_model_source(config("plain", {"--pretrained_model_name_or_path=" + dir_ / "pipe-fp16"}));
  });
  EXPECT_NE(msg.find("diffusion_pytorch_model.safetensors.index.fp16.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("read with variant set to its name"), std::string::npos) << msg;
  std::vector<std::string> warnings;
  EXPECT_NE(error_of([&] { load_train_config({"--variant=../x"}, warnings); }).find("variant"), std::string::npos);
}

TEST_F(PipelineSourceTest, BadSourcesNameThePathAndWhatWasExpected) {
  fs::create_directories(dir_ / "plain");
  std::string msg = error_of([&] {
    resolve_model_source(config("x", {"--pretrained_model_name_or_path=" + dir_ / "plain"}));
  });
  EXPECT_NE(msg.find("[train] pretrained_model_name_or_path '" + dir_ / "plain" +
                     "' is a directory but neither a diffusers pipeline folder (model_index.json) nor a "
                     "transformer folder"),
            std::string::npos)
      << msg;
  msg = error_of([&] { resolve_model_source(config("x", {"--pretrained_model_name_or_path=" + dir_ / "nothing"})); });
  EXPECT_NE(msg.find("'" + dir_ / "nothing" + "' does not exist (expected a diffusers pipeline folder, a "
                     "transformer folder or a .safetensors file)"),
            std::string::npos)
      << msg;
  msg = error_of([&] {
    resolve_model_source(config("x", {"--pretrained_model_name_or_path=" + dir_ / "pipe",
                                      "--pretrained_vae_model_name_or_path=" + dir_ / "plain"}));
  });
  EXPECT_NE(msg.find("the override for 'vae' ('" + dir_ / "plain" + "'): component 'vae' needs the directory '" +
                     dir_ / "plain/vae" + "'"),
            std::string::npos)
      << msg;
  // A VAE named by a hub repository (SimpleTuner configs do) is not needed and not read.
  const auto hub_vae = resolve_model_source(config("x", {"--pretrained_model_name_or_path=" + dir_ / "pipe",
                                                         "--pretrained_vae_model_name_or_path=black-forest-labs/FLUX.1-dev"}));
  EXPECT_EQ(hub_vae.weights.value_or(""), dir_ / "pipe/transformer");
  EXPECT_NE(hub_vae.describe().find("VAE 'black-forest-labs/FLUX.1-dev' not read"), std::string::npos) << hub_vae.describe();
  msg = error_of([&] { resolve_model_source(config("x", {"--pretrained_transformer_subfolder=transformer"})); });
  EXPECT_NE(msg.find("pretrained_transformer_subfolder ('transformer') needs pretrained_transformer_model_name_or_path"),
            std::string::npos)
      << msg;
  const std::string last_shard = models::find_component_weights(dir_ / "pipe/transformer").files.back();
  fs::remove(last_shard);
  msg = error_of([&] { run_training(config("x", {"--pretrained_model_name_or_path=" + dir_ / "pipe"}), quiet_hooks()); });
  EXPECT_NE(msg.find("to shard '" + fs::path(last_shard).filename().string() + "', which does not exist"),
            std::string::npos)
      << msg;
}

}  // namespace pipeline_source_test
}  // namespace
}  // namespace remat::train
