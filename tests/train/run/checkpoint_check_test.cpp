// A training checkpoint is checked whole before anything resumes from it: state.json typed and
// ranged, every file holding exactly the tensors the run needs (remat/train/run/training_state.h).
// Before these checks a negative batch_in_epoch crashed resume, and an epoch of 2^62, 1e30 or 1.5,
// an empty optimizer or RNG file or a renamed RNG entry resumed silently and inexactly.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/train/run/training_state.h"
#include "temp_dir.h"
#include "value_error.h"
#include "test_paths.h"

namespace remat::train {
namespace {
namespace checkpoint_check_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)
namespace fs = std::filesystem;

using remat::testing::error_of;

std::string regression(const std::string& name) {
  return remat::testing::source_dir() + "/tests/data/regressions/" + name;
}

// A checkpoint of one trainable tensor "w" (2, 3) after 2 steps, as the trainer writes it.
TrainingCheckpoint two_steps() {
  TrainingCheckpoint c;
  c.position = {2, 0, 2};
  c.trainable = {{"w", torch::zeros({2, 3})}};
  c.optimizer = {{"w.exp_avg", torch::zeros({2, 3})},
                 {"w.exp_avg_sq", torch::zeros({2, 3})},
                 {"w.step", torch::tensor(int64_t{2})}};
  c.rng = {{"noise", torch::zeros({16}, torch::kUInt8)}, {"cpu", torch::zeros({16}, torch::kUInt8)}};
  return c;
}

CheckpointExpectations expectations() {
  CheckpointExpectations e;
  e.trainable = {{"w", {2, 3}}};
  e.rng = {{"noise", 16}, {"cpu", 16}};
  e.optional_rng = {{"cuda", -1}};
  e.batches_per_epoch = 8;
  e.gradient_accumulation_steps = 1;
  return e;
}

TEST(CheckpointCheck, StateJsonIsTypedAndRanged) {
  remat::testing::TempDir dir("remat_ckpt_check");
  const std::string state = dir / "state.json";
  const auto with = [&](const std::string& file) {
    fs::copy_file(regression(file), state, fs::copy_options::overwrite_existing);
    return error_of([&] { read_training_position(state); });
  };
  EXPECT_NE(with("state_negative_batch_in_epoch.json").find("batch_in_epoch must be an integer in [0, 9223372036854775807], got -1"),
            std::string::npos);
  EXPECT_NE(with("state_fractional_epoch.json").find("'" + state + "': epoch must be an integer in [0, 9223372036854775807], got 1.5"),
            std::string::npos);
  EXPECT_NE(with("state_float_epoch_1e30.json").find("epoch must be an integer in [0, 9223372036854775807], got 1e+30"),
            std::string::npos);
  const auto write = [&](const std::string& text) {
    std::ofstream(state) << text;
    return error_of([&] { read_training_position(state); });
  };
  EXPECT_NE(write(R"({"global_step": 1000000001, "epoch": 0, "batch_in_epoch": 0})").find("global_step must be an integer in [0, 1000000000]"),
            std::string::npos);
  EXPECT_NE(write(R"({"global_step": true, "epoch": 0, "batch_in_epoch": 0})").find("global_step must be an integer"),
            std::string::npos);
  EXPECT_NE(write(R"({"global_step": 1, "epoch": 0})").find("field batch_in_epoch is missing"), std::string::npos);
  EXPECT_NE(write(R"({"global_step": 1, "epoch": 18446744073709551615, "batch_in_epoch": 0})").find("got 18446744073709551615"),
            std::string::npos);
  EXPECT_NE(write(R"({"global_step": 1, "epoch": 0, "batch_in_epoch": 0, "facts": {"seed": 3}})").find("facts.seed must be a string"),
            std::string::npos);
  EXPECT_NE(write("{\"facts\": " + std::string(100000, '[') + std::string(100000, ']') + "}").find("deeper than 64 levels"),
            std::string::npos);

  // Typed but out of this run's range: 2^62 epochs after 2 steps, a batch past the epoch.
  fs::copy_file(regression("state_huge_epoch.json"), state, fs::copy_options::overwrite_existing);
  TrainingCheckpoint huge = two_steps();
  huge.position = read_training_position(state);
  EXPECT_NE(error_of([&] { validate_training_checkpoint(huge, "ckpt", expectations()); })
                .find("'ckpt/state.json': epoch must be in [0, 2] (global_step 2 x gradient_accumulation_steps 1 "
                      "batches consumed), got 4611686018427387904"),
            std::string::npos);
  TrainingCheckpoint past = two_steps();
  past.position.batch_in_epoch = 9;
  EXPECT_NE(error_of([&] { validate_training_checkpoint(past, "ckpt", expectations()); })
                .find("batch_in_epoch must be in [0, 8] (batches per epoch of this dataset), got 9"),
            std::string::npos);
}

TEST(CheckpointCheck, EveryFileHoldsExactlyTheTensorsOfTheRun) {
  EXPECT_NO_THROW(validate_training_checkpoint(two_steps(), "ckpt", expectations()));
  const auto check = [](const std::function<void(TrainingCheckpoint&)>& edit, const std::string& needle) {
    TrainingCheckpoint c = two_steps();
    edit(c);
    const std::string message = error_of([&] { validate_training_checkpoint(c, "ckpt", expectations()); });
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  };
  check([](auto& c) { c.optimizer.clear(); }, "'ckpt/optimizer.safetensors' has no tensor 'w.exp_avg'");
  check([](auto& c) { c.rng.clear(); }, "'ckpt/rng.safetensors' has no tensor 'cpu'");
  check([](auto& c) { c.rng[0].first = "noize"; }, "'ckpt/rng.safetensors' has no tensor 'noise'");
  check([](auto& c) { c.rng.emplace_back("mt19937", torch::zeros({16}, torch::kUInt8)); }, "holds 'mt19937'");
  check([](auto& c) { c.rng[1].second = torch::zeros({15}, torch::kUInt8); }, "generator state 'cpu' must be U8 of shape [16]");
  check([](auto& c) { c.trainable[0].second = torch::zeros({3, 2}); }, "'w' has shape [3, 2], expected [2, 3]");
  check([](auto& c) { c.trainable.emplace_back("v", torch::zeros({1})); }, "'ckpt/trainable.safetensors' holds 'v'");
  check([](auto& c) { c.optimizer[1].second = torch::zeros({2}); }, "'w.exp_avg_sq' has shape [2], expected [2, 3]");
  check([](auto& c) { c.optimizer[2].second = torch::tensor(int64_t{3}); }, "'w.step' must be in [1, 2] (global_step), got 3");
  check([](auto& c) { c.optimizer[2].second = torch::zeros({2}); }, "'w.step' has shape [2], expected [2, 3]");
  // A CUDA state is optional (a run may move between CPU and CUDA); at step 0 there is no
  // optimizer state.
  TrainingCheckpoint cuda = two_steps();
  cuda.rng.emplace_back("cuda", torch::zeros({7}, torch::kUInt8));
  EXPECT_NO_THROW(validate_training_checkpoint(cuda, "ckpt", expectations()));
  TrainingCheckpoint fresh = two_steps();
  fresh.position = {0, 0, 0};
  fresh.optimizer.clear();
  EXPECT_NO_THROW(validate_training_checkpoint(fresh, "ckpt", expectations()));
}

// `checkpoint-99999999999999999999` once ended `remat train` with "error: stoll" and exit 1.
TEST(CheckpointCheck, CheckpointNamesPastInt64AreNamedErrors) {
  remat::testing::TempDir dir("remat_ckpt_names");
  fs::create_directories(dir.path() / "checkpoint-99999999999999999999");
  const std::string message = error_of([&] { list_training_checkpoints(dir.str()); });
  EXPECT_NE(message.find("checkpoint-99999999999999999999' is named like a checkpoint, but its step must be at most "
                         "9223372036854775807"),
            std::string::npos)
      << message;
  fs::remove(dir.path() / "checkpoint-99999999999999999999");
  // Entries that cannot be stat'ed (a symlink loop) are not checkpoints.
  fs::create_symlink(dir.path() / "checkpoint-7", dir.path() / "checkpoint-7");
  fs::create_directories(dir.path() / "checkpoint-9");
  ASSERT_EQ(list_training_checkpoints(dir.str()).size(), 1u);
}

// Interrupted saves leave their work directories behind; the next run cleans them up.
TEST(CheckpointCheck, StaleTemporariesAreRemovedOrRestored) {
  remat::testing::TempDir dir("remat_ckpt_stale");
  TrainingCheckpoint c = two_steps();
  save_training_checkpoint(dir.str(), c);  // checkpoint-2
  fs::create_directories(dir.path() / ".tmp-checkpoint-4-123" / "part");
  // A replaced checkpoint-2 whose replacement finished: stale. A replaced checkpoint-3 whose
  // replacement never arrived: the only copy, restored.
  fs::create_directories(dir.path() / ".old-checkpoint-2-55");
  fs::create_directories(dir.path() / ".old-checkpoint-3-66");
  fs::create_directories(dir.path() / ".other");
  const auto done = remove_stale_checkpoint_temporaries(dir.str());
  EXPECT_EQ(done.size(), 3u);
  EXPECT_FALSE(fs::exists(dir.path() / ".tmp-checkpoint-4-123"));
  EXPECT_FALSE(fs::exists(dir.path() / ".old-checkpoint-2-55"));
  EXPECT_FALSE(fs::exists(dir.path() / ".old-checkpoint-3-66"));
  EXPECT_TRUE(fs::is_directory(dir.path() / "checkpoint-3"));
  EXPECT_TRUE(fs::is_directory(dir.path() / "checkpoint-2"));
  EXPECT_TRUE(fs::is_directory(dir.path() / ".other"));
}

}  // namespace checkpoint_check_test
}  // namespace
}  // namespace remat::train
