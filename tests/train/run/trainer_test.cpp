// remat train end to end on the tiny Flux preset: exact resume, learning, outputs, errors.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/io/safetensors.h"
#include "remat/models/flux.h"
#include "remat/models/lora.h"
#include "remat/train/options/config.h"
#include "remat/train/data/data.h"
#include "remat/train/family/family.h"
#include "remat/train/run/trainer.h"
#include "train/quiet_hooks.h"
#include "safetensors_tensors.h"
#include "temp_dir.h"
#include "flux_tiny_dataset.h"
#include "test_paths.h"

namespace remat::train {
namespace {
namespace trainer_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::quiet_hooks;
using remat::testing::read_tensors;
namespace fs = std::filesystem;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    remat::testing::make_flux_tiny_dataset((root_ / "data").string(), 16);
  }

  // A validated config for flux-tiny on the test data.
  TrainConfig config(const std::string& output, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = remat::testing::flux_tiny_lora_args((root_ / "data").string(), (root_ / output).string());
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<std::string> warnings;
    return load_train_config(args, warnings);
  }


  remat::testing::TempDir dir_{"remat_trainer"};
  const fs::path& root_ = dir_.path();
};

// 10 steps in one run equal 5 steps, an interruption (Ctrl-C path), a resume and 5 more, bit for
// bit, on CPU.
TEST_F(TrainerTest, ResumeContinuesExactly) {
  const auto once = run_training(config("once", {"--max_train_steps=10", "--gradient_accumulation_steps=2"}), quiet_hooks());
  ASSERT_EQ(once.final_step, 10);

  std::atomic<bool> stop{false};
  auto hooks = quiet_hooks();
  hooks.stop_requested = &stop;
  hooks.on_step = [&](const StepRecord& r) {
    if (r.step == 5) stop = true;
  };
  const auto first = run_training(config("split", {"--max_train_steps=10", "--gradient_accumulation_steps=2"}), hooks);
  EXPECT_TRUE(first.interrupted);
  EXPECT_EQ(first.final_step, 5);
  EXPECT_TRUE(first.weights_path.empty());
  EXPECT_EQ(fs::path(first.last_checkpoint).filename(), "checkpoint-5");

  const auto second = run_training(config("split", {"--max_train_steps=10", "--gradient_accumulation_steps=2"}), quiet_hooks());
  EXPECT_FALSE(second.interrupted);
  EXPECT_EQ(second.records.front().step, 6);
  EXPECT_EQ(second.final_step, 10);

  const auto a = read_tensors(once.weights_path), b = read_tensors(second.weights_path);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name;
  }
  for (size_t i = 0; i < second.records.size(); ++i) {
    EXPECT_EQ(second.records[i].loss, once.records[5 + i].loss) << "step " << 6 + i;
  }
  // The resumed run appended to the metrics file: 10 records, steps 1..10.
  std::ifstream metrics(root_ / "split" / kMetricsFile);
  std::string line;
  int64_t step = 0;
  while (std::getline(metrics, line)) EXPECT_EQ(nlohmann::json::parse(line).at("step").get<int64_t>(), ++step);
  EXPECT_EQ(step, 10);
}

TEST_F(TrainerTest, LossFallsOnTheDemoData) {
  const auto result = run_training(config("learn", {"--max_train_steps=40", "--model_type=full", "--learning_rate=2e-3"}), quiet_hooks());
  ASSERT_EQ(result.records.size(), 40u);
  double head = 0, tail = 0;
  for (int i = 0; i < 10; ++i) {
    head += result.records[i].loss / 10;
    tail += result.records[30 + i].loss / 10;
  }
  std::printf("loss: first 10 steps %.4f, last 10 steps %.4f\n", head, tail);
  EXPECT_LT(tail, 0.8 * head);
}

TEST_F(TrainerTest, LoraFileUsesPeftKeysAndReloads) {
  const auto result = run_training(config("lora", {"--max_train_steps=3", "--lora_alpha=8"}), quiet_hooks());
  EXPECT_EQ(fs::path(result.weights_path).filename(), kLoraWeightsFile);
  const auto file = io::SafetensorsFile::open(result.weights_path);
  ASSERT_TRUE(file.contains("transformer.transformer_blocks.0.attn.to_q.lora_A.weight"));
  EXPECT_EQ(file.info("transformer.transformer_blocks.0.attn.to_q.lora_A.weight").shape,
            (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(file.info("transformer.transformer_blocks.0.attn.to_q.lora_B.weight").shape,
            (std::vector<int64_t>{64, 4}));
  EXPECT_TRUE(file.contains("transformer.single_transformer_blocks.1.attn.to_v.lora_B.weight"));
  for (const auto& name : file.names()) {
    EXPECT_EQ(name.rfind("transformer.", 0), 0u) << name;
    EXPECT_TRUE(name.find(".lora_A.weight") != std::string::npos ||
                name.find(".lora_B.weight") != std::string::npos) << name;
  }
  EXPECT_EQ(file.metadata().at("lora_alpha"), "8.0");
  EXPECT_EQ(file.metadata().at("lora_rank"), "4");
  const auto adapter = nlohmann::json::parse(file.metadata().at("lora_adapter_metadata"));
  EXPECT_EQ(adapter.at("transformer.r").get<int64_t>(), 4);
  EXPECT_EQ(adapter.at("transformer.lora_alpha").get<double>(), 8.0);
  EXPECT_EQ(adapter.at("transformer.target_modules").size(), models::flux_lora_target_modules("all").size());

  // Loading the file into a fresh LoRA model gives back the trained factors, and B moved from 0.
  torch::manual_seed(99);
  models::Flux fresh(models::FluxConfig::preset("flux-tiny"));
  models::apply_lora(*fresh, models::flux_lora_target_modules("all"), 4, 8.0);
  io::LoadOptions options;
  options.strict = false;
  options.strip_prefix = "transformer.";
  const auto report = io::load_state_dict_into(*fresh, result.weights_path, options);
  EXPECT_TRUE(report.unexpected.empty()) << report.describe();
  EXPECT_EQ(report.loaded.size(), file.names().size());
  const auto lora = models::lora_state_dict(*fresh);
  for (const auto& name : file.names()) {
    EXPECT_TRUE(torch::equal(lora.at(name), file.tensor(name))) << name;
  }
  EXPECT_GT(file.tensor("transformer.transformer_blocks.0.attn.to_q.lora_B.weight").abs().max().item<float>(), 0.0f);
}

TEST_F(TrainerTest, FullFineTuneSavesDiffusersKeys) {
  const auto result = run_training(config("full", {"--max_train_steps=2", "--model_type=full"}), quiet_hooks());
  models::Flux fresh(models::FluxConfig::preset("flux-tiny"));
  const auto report = io::load_state_dict_into(*fresh, result.weights_path);  // strict
  EXPECT_TRUE(report.ok()) << report.describe();
  EXPECT_EQ(static_cast<int64_t>(report.loaded.size()),
            models::state_dict_key_count(models::FluxConfig::preset("flux-tiny")));
}

// Note [Startup checks]: a checkpoint edited by hand is refused before anything is restored,
// naming the file and the field. A negative batch_in_epoch once indexed the epoch's batches at -1.
TEST_F(TrainerTest, ResumeRefusesACorruptCheckpoint) {
  const auto first = run_training(config("corrupt", {"--max_train_steps=2"}), quiet_hooks());
  const fs::path state = fs::path(first.last_checkpoint) / "state.json";
  const fs::path optimizer = fs::path(first.last_checkpoint) / "optimizer.safetensors";
  const fs::path saved_state = root_ / "state.json", saved_optimizer = root_ / "optimizer.safetensors";
  fs::copy_file(state, saved_state);
  fs::copy_file(optimizer, saved_optimizer);
  const auto expect_refused = [&](const std::string& needle) {
    try {
      run_training(config("corrupt", {"--max_train_steps=4"}), quiet_hooks());
      ADD_FAILURE() << "resumed from a corrupt checkpoint";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fs::copy_file(remat::testing::source_dir() + "/tests/data/regressions/state_negative_batch_in_epoch.json", state,
                fs::copy_options::overwrite_existing);
  expect_refused(state.string() + "': batch_in_epoch must be an integer in [0, ");
  fs::copy_file(remat::testing::source_dir() + "/tests/data/regressions/state_huge_epoch.json", state,
                fs::copy_options::overwrite_existing);
  expect_refused("state.json': epoch must be in [0, 2]");
  fs::copy_file(saved_state, state, fs::copy_options::overwrite_existing);
  io::save_safetensors(optimizer.string(), {});  // an empty optimizer file
  expect_refused("optimizer.safetensors' has no tensor '");
  fs::copy_file(saved_optimizer, optimizer, fs::copy_options::overwrite_existing);
  EXPECT_EQ(run_training(config("corrupt", {"--max_train_steps=4"}), quiet_hooks()).final_step, 4);
}

// Data whose width does not match the model is found before anything is written (it was found
// at the first step, after metrics.jsonl existed).
TEST_F(TrainerTest, DataOfAnotherWidthFailsBeforeAnyOutput) {
  DemoDatasetOptions wide;
  wide.sizes = {{8, 8}};
  wide.text_tokens = 8;
  wide.joint_attention_dim = 64;  // flux-small's, not flux-tiny's 32
  wide.pooled_projection_dim = 16;
  make_demo_dataset((root_ / "wide").string(), model_family("flux").latents, 4, 7, wide);
  try {
    run_training(config("wide-out", {"--max_train_steps=1", "--instance_data_dir=" + (root_ / "wide").string()}),
                 quiet_hooks());
    FAIL() << "trained flux-tiny on 64-wide text embeddings";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.option(), "instance_data_dir");
    EXPECT_NE(std::string(e.what()).find("prompt_embeds width D = 64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("flux-tiny reads 32"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(root_ / "wide-out" / kMetricsFile));
}

// Paths are checked at startup, each a named ValidationError; saves interrupted by kill -9 leave
// .tmp-checkpoint-* directories, which the next run removes.
TEST_F(TrainerTest, StartupChecksPathsAndRemovesStaleTemporaries) {
  std::ofstream(root_ / "a-file") << "x";
  try {
    run_training(config("a-file", {"--max_train_steps=1"}), quiet_hooks());
    FAIL();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.option(), "output_dir");
  }
  fs::create_symlink(root_ / "data" / "loop.safetensors", root_ / "data" / "loop.safetensors");
  try {
    run_training(config("loop-out", {"--max_train_steps=1"}), quiet_hooks());
    FAIL();
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("loop.safetensors' cannot be read: Too many levels of symbolic links"),
              std::string::npos)
        << e.what();
  }
  fs::remove(root_ / "data" / "loop.safetensors");
  fs::create_directories(root_ / "stale" / ".tmp-checkpoint-1-42");
  run_training(config("stale", {"--max_train_steps=1"}), quiet_hooks());
  EXPECT_FALSE(fs::exists(root_ / "stale" / ".tmp-checkpoint-1-42"));
  EXPECT_TRUE(fs::exists(root_ / "stale" / "checkpoint-1"));
}

TEST_F(TrainerTest, MissingDataDirectoryIsAValidationError) {
  std::vector<std::string> warnings;
  auto cfg = load_train_config({"--model_flavour=flux-tiny", "--output_dir=" + (root_ / "x").string()}, warnings);
  try {
    run_training(cfg, quiet_hooks());
    FAIL();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.option(), "instance_data_dir");
  }
}

}  // namespace trainer_test
}  // namespace
}  // namespace remat::train

namespace remat::train {
namespace {
namespace trainer_test {

TEST(MageFlowTraining, TrainsOnPackedBatchesAndSavesPeftLora) {
  remat::testing::TempDir dir("remat_mageflow_train");
  const fs::path& root = dir.path();
  DemoDatasetOptions options;
  options.sizes = {{4, 4}};
  options.text_tokens = 6;
  options.joint_attention_dim = 32;  // mageflow-tiny context_in_dim
  make_demo_dataset((root / "data").string(), remat::train::model_family("mageflow").latents, 8, 5, options);
  std::vector<std::string> warnings;
  const auto config = load_train_config(
      {"--model_family=mageflow", "--model_flavour=mageflow-tiny", "--model_type=lora",
       "--lora_rank=2", "--instance_data_dir=" + (root / "data").string(),
       "--output_dir=" + (root / "out").string(), "--train_batch_size=2", "--max_train_steps=3",
       "--mixed_precision=no", "--gradient_checkpointing_interval=2", "--seed=1",
       "--resume_from_checkpoint=latest"},
      warnings);
  TrainerHooks hooks;
  hooks.log = [](const std::string&) {};
  hooks.progress_stream = std::fopen("/dev/null", "w");
  const auto result = run_training(config, hooks);
  ASSERT_EQ(result.records.size(), 3u);
  for (const auto& r : result.records) EXPECT_TRUE(std::isfinite(r.loss));
  const auto file = io::SafetensorsFile::open(result.weights_path);
  // SimpleTuner's MageFlow default target includes the text-side projections.
  EXPECT_TRUE(file.contains("transformer.transformer_blocks.0.attn.add_q_proj.lora_A.weight"));
  EXPECT_TRUE(file.contains("transformer.transformer_blocks.1.attn.to_out.0.lora_B.weight"));
}

// gradient_checkpointing_interval=auto: one describe_plan line, every step's tracked peak within
// the budget; a budget below the smallest possible peak stops before training with the option
// named and the smallest peak given.
TEST_F(TrainerTest, AutoIntervalPlansWithinTheBudget) {
  std::vector<std::string> lines;
  std::vector<int64_t> peaks;
  TrainerHooks hooks = quiet_hooks();
  hooks.log = [&](const std::string& line) { lines.push_back(line); };
  hooks.on_step = [&](const StepRecord& record) { peaks.push_back(record.peak_bytes); };
  const int64_t budget = 64LL << 20;
  run_training(config("auto", {"--gradient_checkpointing_interval=auto",
                               "--gradient_checkpointing_memory_budget=" + std::to_string(budget),
                               "--max_train_steps=2"}),
               hooks);
  const auto plan_line = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("gradient_checkpointing_interval auto:") != std::string::npos;
  });
  ASSERT_NE(plan_line, lines.end());
  EXPECT_NE(plan_line->find("of 64.00 MiB budget"), std::string::npos) << *plan_line;
  // The same per-stack layout line a fixed interval logs.
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.rfind("[train] gradient checkpointing: double blocks (2): ", 0) == 0 &&
           l.find("; single blocks (2): ") != std::string::npos;
  }));
  ASSERT_EQ(peaks.size(), 2u);
  for (int64_t peak : peaks) EXPECT_LE(peak, budget);
}

// At start the trainer logs the layout it runs, each block stack's segments, and the optimizer.
TEST_F(TrainerTest, LogsTheCheckpointLayoutOfEachStack) {
  const auto logged = [&](const std::string& output, const std::vector<std::string>& extra) {
    std::vector<std::string> lines;
    TrainerHooks hooks = quiet_hooks();
    hooks.log = [&](const std::string& line) { lines.push_back(line); };
    std::vector<std::string> args = extra;
    args.push_back("--max_train_steps=1");
    run_training(config(output, args), hooks);
    return lines;
  };
  const auto has = [](const std::vector<std::string>& lines, const std::string& line) {
    return std::find(lines.begin(), lines.end(), line) != lines.end();
  };
  auto lines = logged("fixed", {});  // interval 2
  EXPECT_TRUE(has(lines, "[train] gradient checkpointing: double blocks (2): recompute[0-1]; single blocks (2): "
                         "recompute[0-1]"));
  EXPECT_TRUE(has(lines, "[train] optimizer adamw_bf16: betas (0.9, 0.999), weight decay 0.01, eps 1e-06"));
  lines = logged("per-block", {"--gradient_checkpointing_interval=1", "--optimizer=optimi-lion"});
  EXPECT_TRUE(has(lines, "[train] gradient checkpointing: double blocks (2): recompute[0] recompute[1]; single "
                         "blocks (2): recompute[0] recompute[1]"));
  EXPECT_TRUE(has(lines, "[train] optimizer optimi-lion: betas (0.9, 0.99), weight decay 0"));
  lines = logged("off", {"--gradient_checkpointing=false", "--gradient_checkpointing_interval="});
  EXPECT_TRUE(has(lines, "[train] gradient checkpointing: off"));
}

TEST_F(TrainerTest, AutoIntervalNothingFitsStopsWithTheSmallestPeak) {
  try {
    run_training(config("tiny-budget", {"--gradient_checkpointing_interval=auto",
                                        "--gradient_checkpointing_memory_budget=4096",
                                        "--max_train_steps=1"}),
                 quiet_hooks());
    FAIL() << "expected the 4 KiB budget to be refused";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.option(), "gradient_checkpointing_memory_budget");
    const std::string text = e.what();
    EXPECT_NE(text.find("gradient_checkpointing_memory_budget must be at least"), std::string::npos) << text;
    EXPECT_NE(text.find("got 4.00 KiB"), std::string::npos) << text;
  }
}

}  // namespace trainer_test
}  // namespace
}  // namespace remat::train
