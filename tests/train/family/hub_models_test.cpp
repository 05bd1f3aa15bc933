// resolve_hub_models: which options are looked up in the hub cache and what becomes of them. The
// whole path (training and sampling from a cache built in huggingface_hub's layout, each error)
// is tests/cli/hub_cache_test.sh; here the rules, on a cache holding one demo pipeline.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "remat/encoders/demo_pipeline.h"
#include "remat/train/family/hub_models.h"
#include "remat/train/family/model_source.h"
#include "remat/train/options/config.h"
#include "scoped_environment.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::train {
namespace {
namespace hub_models_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::error_of;
using remat::testing::ScopedEnvironment;

const std::string kCommit(40, 'c');

class HubModelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The demo pipeline as the snapshot of org/pipe at main (plain files: symlinks are the io
    // test's concern).
    const fs::path snapshot = fs::path(cache_.str()) / "models--org--pipe" / "snapshots" / kCommit;
    encoders::DemoPipelineOptions options;
    encoders::write_demo_pipeline(snapshot.string(), options);
    fs::create_directories(fs::path(cache_.str()) / "models--org--pipe" / "refs");
    std::ofstream(fs::path(cache_.str()) / "models--org--pipe" / "refs" / "main") << kCommit;
    snapshot_ = snapshot.string();
  }

  TrainConfig load(std::vector<std::string> args) {
    args.insert(args.begin(), {"--model_family=flux", "--model_type=lora", "--instance_data_dir=" + cache_.str()});
    warnings_.clear();
    return load_train_config(args, warnings_);
  }

  bool warned(const std::string& part) const {
    for (const auto& w : warnings_) {
      if (w.find(part) != std::string::npos) return true;
    }
    return false;
  }

  remat::testing::TempDir cache_{"hub_models_test"};
  ScopedEnvironment env_{{{"HF_HUB_CACHE", cache_.str()}, {"HUGGINGFACE_HUB_CACHE", std::nullopt}}};
  std::string snapshot_;
  std::vector<std::string> warnings_;
};

TEST_F(HubModelsTest, IdsBecomeSnapshotFoldersAndAreLogged) {
  TrainConfig config = load({"--model_flavour=dev", "--pretrained_model_name_or_path=Org/Pipe",
                             "--pretrained_transformer_model_name_or_path=org/pipe",
                             "--pretrained_vae_model_name_or_path=org/pipe", "--revision=" + kCommit});
  const auto log = resolve_hub_models(config);
  EXPECT_EQ(config.pretrained_model_name_or_path, snapshot_);
  EXPECT_EQ(config.pretrained_transformer_model_name_or_path, snapshot_);
  EXPECT_EQ(config.pretrained_vae_model_name_or_path, snapshot_);
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0], "[train] pretrained_model_name_or_path: Org/Pipe at revision " + kCommit + " (commit " + kCommit +
                        ") from the Hugging Face cache: " + snapshot_);
  // What training then reads is the snapshot's transformer and VAE.
  const ModelSource source = resolve_model_source(config);
  EXPECT_EQ(source.weights, (fs::path(snapshot_) / "transformer").string());
  EXPECT_EQ(source.vae_directory, (fs::path(snapshot_) / "vae").string());
}

TEST_F(HubModelsTest, APublishedFlavourWithoutAPathMeansItsHubId) {
  TrainConfig config = load({"--model_flavour=krea"});
  EXPECT_FALSE(warned("random"));
  const std::string message = error_of([&] { resolve_hub_models(config); });
  EXPECT_EQ(message.rfind("[train] black-forest-labs/flux.1-krea-dev (revision main) is not in the Hugging Face cache", 0),
            0u)
      << message;
  EXPECT_NE(message.find("(model_flavour krea without pretrained_model_name_or_path means "
                         "black-forest-labs/flux.1-krea-dev, as SimpleTuner maps it; give a local path or another id, "
                         "or pretrained_model_name_or_path=random to start from random weights)"),
            std::string::npos)
      << message;
}

TEST_F(HubModelsTest, RandomWeightsOnlyByNameOrForRematsSmallFlavours) {
  TrainConfig random = load({"--model_flavour=dev", "--pretrained_model_name_or_path=random"});
  EXPECT_TRUE(warned("pretrained_model_name_or_path is random: the dev transformer starts from random weights"));
  EXPECT_TRUE(resolve_hub_models(random).empty());
  EXPECT_FALSE(random.pretrained_model_name_or_path.has_value());
  EXPECT_FALSE(resolve_model_source(random).weights.has_value());

  TrainConfig tiny = load({"--model_flavour=flux-tiny"});
  EXPECT_TRUE(warned("the flux-tiny transformer (remat's small configuration) starts from random weights"));
  EXPECT_TRUE(resolve_hub_models(tiny).empty());
  EXPECT_FALSE(tiny.pretrained_model_name_or_path.has_value());
}

TEST_F(HubModelsTest, LocalPathsAndNonIdsAreLeftAlone) {
  TrainConfig local = load({"--model_flavour=dev", "--pretrained_model_name_or_path=" + snapshot_});
  EXPECT_TRUE(resolve_hub_models(local).empty());
  EXPECT_EQ(local.pretrained_model_name_or_path, snapshot_);
  // Not an id (three parts): left for resolve_model_source to refuse as a missing path.
  TrainConfig odd = load({"--model_flavour=dev", "--pretrained_model_name_or_path=a/b/c"});
  EXPECT_TRUE(resolve_hub_models(odd).empty());
  EXPECT_NE(error_of([&] { resolve_model_source(odd); }).find("'a/b/c' does not exist"), std::string::npos);
}

TEST_F(HubModelsTest, AVaeIdNotInTheCacheIsNotedNotRequired) {
  TrainConfig config = load({"--model_flavour=dev", "--pretrained_model_name_or_path=org/pipe",
                             "--pretrained_vae_model_name_or_path=madebyollin/ae-fp16-fix"});
  const auto log = resolve_hub_models(config);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[1].rfind("[train] pretrained_vae_model_name_or_path not resolved, not needed for training: [train] "
                         "madebyollin/ae-fp16-fix (revision main) is not in the Hugging Face cache",
                         0),
            0u)
      << log[1];
  EXPECT_EQ(config.pretrained_vae_model_name_or_path, "madebyollin/ae-fp16-fix");
  EXPECT_NE(resolve_model_source(config).vae_note.find("not read"), std::string::npos);
}

}  // namespace hub_models_test
}  // namespace
}  // namespace remat::train
