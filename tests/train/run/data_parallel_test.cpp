// Several processes of `remat train` on 127.0.0.1 with Gloo against one process with the same
// global batch (Note [One run, any world size] in src/train/run/data_parallel.h): equal weights,
// resumes across world sizes, and the failures a run must report rather than hang on.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>
#include <utility>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "flux_tiny_dataset.h"
#include "rank_processes.h"
#include "safetensors_tensors.h"
#include "remat/encoders/demo_pipeline.h"
#include "remat/image/image_file.h"
#include "remat/image/png_file.h"
#include "remat/io/safetensors.h"
#include "remat/train/options/config.h"
#include "remat/train/run/ema.h"
#include "remat/train/run/trainer.h"
#include "temp_dir.h"
#include "train/quiet_hooks.h"
#include "test_paths.h"

namespace remat::train {
namespace {
namespace data_parallel_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::RankExit;

constexpr std::chrono::seconds kDeadline{240};

class DataParallelTraining : public ::testing::Test {
 protected:
  void SetUp() override { remat::testing::make_flux_tiny_dataset((root_ / "data").string(), 16); }

  // flux-tiny on the test data; `extra` adds or overrides options.
  std::vector<std::string> args(const std::string& output, const std::vector<std::string>& extra) const {
    std::vector<std::string> out{"--model_family=flux", "--model_flavour=flux-tiny", "--lora_rank=4",
                                 "--instance_data_dir=" + (root_ / "data").string(),
                                 "--output_dir=" + (root_ / output).string(), "--train_batch_size=2",
                                 "--learning_rate=1e-2", "--lr_scheduler=constant", "--mixed_precision=no",
                                 "--seed=3", "--checkpointing_steps=0", "--resume_from_checkpoint=latest"};
    out.insert(out.end(), extra.begin(), extra.end());
    return out;
  }

  TrainResult one_process(const std::string& output, const std::vector<std::string>& extra) {
    std::vector<std::string> warnings;
    return run_training(load_train_config(args(output, extra), warnings), remat::testing::quiet_hooks());
  }

  std::vector<RankExit> two_processes(const std::string& output, const std::vector<std::string>& extra,
                                      const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> cli{"train"};
    const auto rest = args(output, extra);
    cli.insert(cli.end(), rest.begin(), rest.end());
    fs::create_directories(root_ / ("logs-" + output));
    return remat::testing::run_ranks(remat::testing::cli_path(), cli, 2, (root_ / ("logs-" + output)).string(), kDeadline, env);
  }

  // Two ranks of an endless LoRA run (interval 2), returned once both are some steps in (the
  // reducer is set up after the rendezvous and the model; "all-reduced in" is its first report).
  std::pair<remat::testing::RankProcess, remat::testing::RankProcess> two_training_ranks(
      const std::string& output, const std::map<std::string, std::string>& env) {
    const int port = remat::testing::free_port();
    std::vector<std::string> cli{"train"};
    const auto rest = args(output, {"--model_type=lora", "--max_train_steps=100000", "--gradient_checkpointing_interval=2"});
    cli.insert(cli.end(), rest.begin(), rest.end());
    const fs::path logs = root_ / ("logs-" + output);
    fs::create_directories(logs);
    auto rank0 = remat::testing::start_rank(remat::testing::cli_path(), cli, 0, 2, port, (logs / "rank0.log").string(), env);
    auto rank1 = remat::testing::start_rank(remat::testing::cli_path(), cli, 1, 2, port, (logs / "rank1.log").string(), env);
    const auto start = std::chrono::steady_clock::now();
    while (remat::testing::read_text(rank1.log_path).find("all-reduced in") == std::string::npos &&
           std::chrono::steady_clock::now() - start < kDeadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // some steps in
    return {rank0, rank1};
  }

  // The survivor's error names its rank, a collective, the lost peer and the timeout.
  static void expect_collective_failure(const std::string& log, const std::string& timeout) {
    const auto error_at = log.find("error: [distributed]");
    ASSERT_NE(error_at, std::string::npos) << log;
    std::cout << "[ measured ] " << log.substr(error_at, log.find('\n', error_at) - error_at) << "\n";
    EXPECT_NE(log.find("[distributed] rank 0 of 2:"), std::string::npos) << log;
    EXPECT_NE(log.find("another rank stopped"), std::string::npos) << log;
    EXPECT_NE(log.find("within " + timeout + " (SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS)"), std::string::npos) << log;
  }

  static void expect_succeeded(const std::vector<RankExit>& exits) {
    for (size_t r = 0; r < exits.size(); ++r) {
      EXPECT_EQ(exits[r].exit_code, 0) << "rank " << r << " (signal " << exits[r].signal << ", timed out "
                                       << exits[r].timed_out << "):\n"
                                       << exits[r].log;
    }
  }

  static std::map<std::string, at::Tensor> weights(const fs::path& path) {
    return remat::testing::read_tensors(path.string());
  }

  // Largest |a - b| over every tensor; the key sets must match.
  static double max_difference(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
    EXPECT_EQ(a.size(), b.size());
    double worst = 0;
    for (const auto& [name, t] : a) {
      const auto it = b.find(name);
      if (it == b.end()) {
        ADD_FAILURE() << "missing " << name;
        continue;
      }
      worst = std::max(worst, (t.to(at::kDouble) - it->second.to(at::kDouble)).abs().max().item<double>());
    }
    return worst;
  }

  static void expect_bitwise_equal(const fs::path& a, const fs::path& b) {
    const auto wa = weights(a), wb = weights(b);
    ASSERT_EQ(wa.size(), wb.size());
    for (const auto& [name, t] : wa) EXPECT_TRUE(torch::equal(t, wb.at(name))) << name;
  }

  static std::vector<double> metric_losses(const fs::path& metrics) {
    std::vector<double> losses;
    std::ifstream in(metrics);
    std::string line;
    while (std::getline(in, line)) {
      const auto at = line.find("\"loss\":");
      if (at != std::string::npos) losses.push_back(std::stod(line.substr(at + 7)));
    }
    return losses;
  }

  remat::testing::TempDir dir_{"remat_data_parallel"};
  const fs::path& root_ = dir_.path();
};

// W = 2, a = 1 against one process with a = 2: powers-of-two scalings and a two-term sum, so the
// weights are equal bit for bit. LoRA, segments of 2 blocks, with EMA weights (equal too).
TEST_F(DataParallelTraining, LoraSegmentedEqualsOneProcessBitForBit) {
  const std::vector<std::string> common{"--model_type=lora", "--gradient_checkpointing_interval=2",
                                        "--max_train_steps=4", "--use_ema=true", "--ema_decay=0.9"};
  expect_succeeded(two_processes("two", common));
  auto single = common;
  single.push_back("--gradient_accumulation_steps=2");
  const TrainResult one = one_process("one", single);
  expect_bitwise_equal(root_ / "two" / kLoraWeightsFile, root_ / "one" / kLoraWeightsFile);
  expect_bitwise_equal(root_ / "two" / kEmaLoraFolder / kLoraWeightsFile, one.ema_weights_path);
  // The LoRA B matrices start at zero: trained weights have moved away from it.
  double largest = 0;
  for (const auto& [name, t] : weights(root_ / "two" / kLoraWeightsFile)) {
    if (name.find("lora_B") != std::string::npos) largest = std::max(largest, t.abs().max().item<double>());
  }
  EXPECT_GT(largest, 1e-4);
  // Rank 0 alone wrote the metrics, one line per step, with the loss of all four micro-batches.
  const auto losses = metric_losses(root_ / "two" / kMetricsFile);
  ASSERT_EQ(losses.size(), 4u);
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], one.records[i].loss, 1e-6) << "step " << i + 1;
}

// Full fine-tune with the layout chosen by `auto`: every weight, bit for bit.
TEST_F(DataParallelTraining, FullFineTuneAutoLayoutEqualsOneProcessBitForBit) {
  const std::vector<std::string> common{"--model_type=full", "--gradient_checkpointing_interval=auto",
                                        "--max_train_steps=3", "--learning_rate=1e-3"};
  const auto exits = two_processes("two", common);
  expect_succeeded(exits);
  EXPECT_NE(exits[0].log.find("global batch 4 = 2 processes x train_batch_size 2 x gradient_accumulation_steps 1"),
            std::string::npos)
      << exits[0].log;
  auto single = common;
  single.push_back("--gradient_accumulation_steps=2");
  one_process("one", single);
  expect_bitwise_equal(root_ / "two" / kFullWeightsFile, root_ / "one" / kFullWeightsFile);
  one_process("untrained", {"--model_type=full", "--max_train_steps=0"});
  EXPECT_GT(max_difference(weights(root_ / "two" / kFullWeightsFile), weights(root_ / "untrained" / kFullWeightsFile)),
            1e-4);
}

// Gradient accumulation on each rank (W = 2, a = 2 against a = 4): the sums associate
// differently, so equal to float32 rounding. The tolerance is far below one step's change.
TEST_F(DataParallelTraining, AccumulationOnEachRankEqualsOneProcessWithinRounding) {
  const std::vector<std::string> common{"--model_type=full", "--gradient_checkpointing_interval=2",
                                        "--max_train_steps=2", "--learning_rate=1e-3"};
  auto two = common;
  two.push_back("--gradient_accumulation_steps=2");
  expect_succeeded(two_processes("two", two));
  auto single = common;
  single.push_back("--gradient_accumulation_steps=4");
  one_process("one", single);
  const double difference =
      max_difference(weights(root_ / "two" / kFullWeightsFile), weights(root_ / "one" / kFullWeightsFile));
  std::cout << "[ measured ] largest weight difference, 2 processes x 2 vs 1 process x 4: " << difference << "\n";
  EXPECT_LE(difference, 1e-6);
  one_process("untrained", {"--model_type=full", "--max_train_steps=0"});
  EXPECT_GT(max_difference(weights(root_ / "two" / kFullWeightsFile), weights(root_ / "untrained" / kFullWeightsFile)),
            1e-4);
}

// An image run on 2 processes: each rank encodes its share of the caches (data::CacheShare),
// then both train on every sample; the weights equal those of one process with the same
// global batch that built its caches alone. Caption dropout is on, so its draws must agree too.
TEST_F(DataParallelTraining, ImageRunSplitsTheCachingAndEqualsOneProcess) {
  const fs::path pipeline = root_ / "pipeline";
  encoders::write_demo_pipeline(pipeline.string());
  const std::vector<std::string> colours{"red", "green", "blue", "grey", "white", "black", "yellow", "purple"};
  fs::create_directories(root_ / "images");
  for (size_t i = 0; i < colours.size(); ++i) {
    auto picture = at::full({32, 32, 3}, static_cast<int64_t>(20 + 25 * i), at::kByte);
    picture.slice(0, 8, 16).select(2, i % 3).fill_(250);
    image::write_png((root_ / "images" / ("a " + colours[i] + " square.png")).string(), picture);
  }
  const std::vector<std::string> common{"--model_type=lora",
                                        "--pretrained_model_name_or_path=" + pipeline.string(),
                                        "--instance_data_dir=" + (root_ / "images").string(),
                                        "--resolution=32",
                                        "--resolution_type=pixel",
                                        "--caption_dropout_probability=0.25",
                                        "--max_train_steps=2"};
  auto two = common;
  two.push_back("--cache_dir=" + (root_ / "cache-two").string());
  const auto exits = two_processes("two", two);
  expect_succeeded(exits);
  int64_t images = 0, captions = 0;
  for (size_t rank = 0; rank < exits.size(); ++rank) {
    static const std::regex share(R"(encoded (\d+) image\(s\) and (\d+) caption\(s\) of its share)");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(exits[rank].log, m, share)) << exits[rank].log;
    std::cout << "[ measured ] rank " << rank << " " << m.str(0) << "\n";
    EXPECT_GT(std::stoll(m[1]), 0) << "rank " << rank << " encoded no picture: the work was not split";
    images += std::stoll(m[1]);
    captions += std::stoll(m[2]);
  }
  EXPECT_EQ(images, 8);     // every picture once
  EXPECT_EQ(captions, 9);   // every caption once, and the empty one

  auto single = common;
  single.push_back("--cache_dir=" + (root_ / "cache-one").string());
  single.push_back("--gradient_accumulation_steps=2");
  one_process("one", single);
  expect_bitwise_equal(root_ / "two" / kLoraWeightsFile, root_ / "one" / kLoraWeightsFile);
  double largest = 0;
  for (const auto& [name, t] : weights(root_ / "two" / kLoraWeightsFile)) {
    if (name.find("lora_B") != std::string::npos) largest = std::max(largest, t.abs().max().item<double>());
  }
  EXPECT_GT(largest, 1e-4);
}

// A checkpoint of two processes resumes in one (with the same global batch), and the reverse;
// both end where one uninterrupted process ends.
TEST_F(DataParallelTraining, CheckpointsResumeAcrossWorldSizes) {
  const std::vector<std::string> common{"--model_type=lora", "--gradient_checkpointing_interval=2"};
  const auto with = [&](std::vector<std::string> extra) {
    auto all = common;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  one_process("reference", with({"--max_train_steps=4", "--gradient_accumulation_steps=2"}));

  // Two processes for steps 1-2, one for 3-4.
  expect_succeeded(two_processes("two-then-one", with({"--max_train_steps=2"})));
  ASSERT_TRUE(fs::exists(root_ / "two-then-one" / "checkpoint-2"));
  const TrainResult resumed = one_process("two-then-one", with({"--max_train_steps=4", "--gradient_accumulation_steps=2"}));
  EXPECT_EQ(resumed.records.size(), 2u);
  expect_bitwise_equal(root_ / "two-then-one" / kLoraWeightsFile, root_ / "reference" / kLoraWeightsFile);

  // One process for steps 1-2, two for 3-4.
  one_process("one-then-two", with({"--max_train_steps=2", "--gradient_accumulation_steps=2"}));
  const auto exits = two_processes("one-then-two", with({"--max_train_steps=4"}));
  expect_succeeded(exits);
  EXPECT_NE(exits[1].log.find("resumed from"), std::string::npos) << exits[1].log;
  expect_bitwise_equal(root_ / "one-then-two" / kLoraWeightsFile, root_ / "reference" / kLoraWeightsFile);
}

// ZeRO-1 (--deepspeed_config zero1) on 2 processes trains what plain data parallel, and so one
// process, trains; its checkpoint (the optimizer state gathered to rank 0) resumes in 1 process.
TEST_F(DataParallelTraining, ZeroStageOneEqualsOneProcessAndResumesInOne) {
  const std::vector<std::string> common{"--model_type=full", "--optimizer=torch-adamw",
                                        "--gradient_checkpointing_interval=2", "--learning_rate=1e-3",
                                        "--use_ema=true", "--ema_decay=0.9"};
  const auto with = [&](std::vector<std::string> extra) {
    auto all = common;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  one_process("reference", with({"--max_train_steps=4", "--gradient_accumulation_steps=2"}));
  const auto exits = two_processes("zero", with({"--max_train_steps=2", "--deepspeed_config=zero1"}));
  expect_succeeded(exits);
  EXPECT_NE(exits[1].log.find("ZeRO stage 1: this rank keeps the optimizer state of"), std::string::npos)
      << exits[1].log;
  one_process("zero", with({"--max_train_steps=4", "--gradient_accumulation_steps=2"}));
  expect_bitwise_equal(root_ / "zero" / kFullWeightsFile, root_ / "reference" / kFullWeightsFile);
  // The EMA weights too, through ZeRO-1's checkpoint and the resume in one process.
  const fs::path ema = fs::path(kEmaCheckpointFolder) / fs::path(kFullWeightsFile).filename();
  expect_bitwise_equal(root_ / "zero" / ema, root_ / "reference" / ema);
}

// A rank killed mid-run ends the other with an error naming the failure, well within the timeout.
TEST_F(DataParallelTraining, KilledRankEndsTheRunWithAClearError) {
  const auto [rank0, rank1] = two_training_ranks("killed", {{"SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS", "60"}});
  ::kill(rank1.pid, SIGKILL);
  const RankExit killed = remat::testing::wait_rank(rank1, std::chrono::seconds(10));
  EXPECT_EQ(killed.signal, SIGKILL);
  const RankExit survivor = remat::testing::wait_rank(rank0, kDeadline);
  EXPECT_FALSE(survivor.timed_out);
  EXPECT_NE(survivor.exit_code, 0) << survivor.log;
  std::cout << "[ measured ] rank 0 ended " << survivor.seconds << " s after rank 1 was killed (timeout 60 s)\n";
  EXPECT_LT(survivor.seconds, 60.0);
  expect_collective_failure(survivor.log, "60 s");
}

// A rank that hangs (stopped: its connections stay open, nothing arrives) is waited for until
// the timeout, then the others fail naming it; never a silent hang.
TEST_F(DataParallelTraining, HungRankEndsTheRunAfterTheTimeout) {
  const auto [rank0, rank1] = two_training_ranks("hung", {{"SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS", "10"}});
  ::kill(rank1.pid, SIGSTOP);
  const RankExit survivor = remat::testing::wait_rank(rank0, std::chrono::seconds(60));
  ::kill(rank1.pid, SIGKILL);  // a stopped process still takes SIGKILL
  remat::testing::wait_rank(rank1, std::chrono::seconds(10));
  EXPECT_FALSE(survivor.timed_out);
  EXPECT_NE(survivor.exit_code, 0) << survivor.log;
  std::cout << "[ measured ] rank 0 ended " << survivor.seconds << " s after rank 1 was stopped (timeout 10 s)\n";
  EXPECT_GE(survivor.seconds, 9.0);  // it waited for the timeout rather than failing on something else
  EXPECT_LT(survivor.seconds, 40.0);
  expect_collective_failure(survivor.log, "10 s");
}

// Ctrl-C reaches the ranks at different moments (here only rank 1 gets it): they agree to stop
// after the same step, and rank 0 saves that step's checkpoint.
TEST_F(DataParallelTraining, InterruptingOneRankStopsEveryRankAfterTheSameStep) {
  const auto [rank0, rank1] = two_training_ranks("interrupted", {});
  ::kill(rank1.pid, SIGINT);
  const RankExit exit1 = remat::testing::wait_rank(rank1, kDeadline);
  const RankExit exit0 = remat::testing::wait_rank(rank0, kDeadline);
  EXPECT_EQ(exit1.exit_code, 128 + SIGINT) << exit1.log;
  EXPECT_EQ(exit0.exit_code, 128 + SIGINT) << exit0.log;  // not signalled, but interrupted with the others
  // Both name the same checkpoint, which rank 0 wrote whole.
  const auto saved = [](const std::string& log) {
    const auto at = log.find("saved ");
    return at == std::string::npos ? std::string() : log.substr(at, log.find(' ', at + 6) - at);
  };
  ASSERT_FALSE(saved(exit0.log).empty()) << exit0.log;
  EXPECT_EQ(saved(exit0.log), saved(exit1.log));
  const std::string checkpoint = saved(exit0.log).substr(6);
  EXPECT_TRUE(fs::exists(fs::path(checkpoint) / "state.json")) << checkpoint;
}

// Ranks started with different configurations stop before training, naming the option.
TEST_F(DataParallelTraining, MismatchedConfigurationsAreRefused) {
  const int port = remat::testing::free_port();
  fs::create_directories(root_ / "logs-mismatch");
  std::vector<remat::testing::RankProcess> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> cli{"train"};
    const auto rest = args("mismatch", {"--max_train_steps=2", r == 0 ? "--learning_rate=1e-2" : "--learning_rate=2e-2"});
    cli.insert(cli.end(), rest.begin(), rest.end());
    ranks.push_back(remat::testing::start_rank(remat::testing::cli_path(), cli, r, 2, port,
                                               (root_ / ("logs-mismatch/rank" + std::to_string(r) + ".log")).string()));
  }
  for (const auto& rank : ranks) {
    const RankExit exit = remat::testing::wait_rank(rank, kDeadline);
    EXPECT_EQ(exit.exit_code, 2) << exit.log;
    EXPECT_NE(exit.log.find("the configuration differs from rank " + std::to_string(1 - rank.rank) + "'s:"),
              std::string::npos)
        << exit.log;
    EXPECT_NE(exit.log.find("learning_rate="), std::string::npos) << exit.log;
  }
  EXPECT_FALSE(fs::exists(root_ / "mismatch" / kMetricsFile));
}

}  // namespace data_parallel_test
}  // namespace
}  // namespace remat::train
