// `remat train --use_ema` end to end on the tiny Flux preset: the average in every checkpoint
// against a float64 recurrence over the weights the checkpoints hold, exact resume, the final
// files beside the trained weights (LoRA and full), and the step peak against the memory model.
#include <atomic>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/io/safetensors.h"
#include "remat/train/memory/admission.h"
#include "remat/train/options/config.h"
#include "remat/train/run/ema.h"
#include "remat/train/run/trainer.h"
#include "train/quiet_hooks.h"
#include "safetensors_tensors.h"
#include "temp_dir.h"
#include "flux_tiny_dataset.h"

namespace remat::train {
namespace {
namespace ema_trainer_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::quiet_hooks;
namespace fs = std::filesystem;

class EmaTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override { remat::testing::make_flux_tiny_dataset((root_ / "data").string(), 16); }

  TrainConfig config(const std::string& output, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = remat::testing::flux_tiny_lora_args((root_ / "data").string(), (root_ / output).string());
    args.push_back("--max_train_steps=8");
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<std::string> warnings;
    return load_train_config(args, warnings);
  }

  static std::map<std::string, at::Tensor> read_all(const fs::path& path) {
    return remat::testing::read_tensors(path.string());
  }
  static fs::path ema_file(const fs::path& checkpoint) {
    return checkpoint / kEmaCheckpointFolder / kEmaCheckpointFile;
  }

  remat::testing::TempDir dir_{"remat_ema_trainer"};
  const fs::path& root_ = dir_.path();
};

// Every step checkpointed: the trained weights after each step are on disk, so the test computes
// SimpleTuner's recurrence over them in float64 and compares it with every checkpoint's average.
// Updates every 2nd step, copying the weights before step 3 (ema_warmup_steps), so the reference
// starts at step 2's weights and needs nothing the test cannot read.
TEST_F(EmaTrainerTest, CheckpointedAverageEqualsAFloat64RecurrenceOverTheWeights) {
  const auto result = run_training(config("recurrence", {"--use_ema=true", "--ema_decay=0.8", "--ema_update_interval=2",
                                                         "--ema_warmup_steps=3", "--checkpointing_steps=1",
                                                         "--checkpoints_total_limit=20"}),
                                   quiet_hooks());
  ASSERT_EQ(result.final_step, 8);
  EmaSettings settings;
  settings.decay = 0.8;
  settings.warmup_steps = 3;
  std::map<std::string, at::Tensor> reference;
  for (int64_t step = 2; step <= 8; ++step) {
    const fs::path checkpoint = root_ / "recurrence" / ("checkpoint-" + std::to_string(step));
    const auto weights = read_all(checkpoint / "trainable.safetensors");
    if (step % 2 == 0) {
      const double d = ema_decay_at(settings, step);
      EXPECT_EQ(d, step < 3 ? 0.0 : 0.8);
      if (reference.empty()) {
        for (const auto& [name, w] : weights) reference[name] = w.to(at::kDouble);
      } else {
        for (auto& [name, s] : reference) s = s - (1.0 - d) * (s - weights.at(name).to(at::kDouble));
      }
    }
    const auto saved = read_all(ema_file(checkpoint));
    ASSERT_EQ(saved.size(), reference.size()) << step;
    for (const auto& [name, s] : reference) {
      EXPECT_TRUE(torch::allclose(saved.at(name).to(at::kDouble), s, 1e-6, 1e-7))
          << name << " at step " << step << ": max diff " << (saved.at(name).to(at::kDouble) - s).abs().max().item<double>();
    }
    EXPECT_EQ(io::SafetensorsFile::open(ema_file(checkpoint).string()).metadata().at("optimization_step"),
              std::to_string(step - step % 2));
  }
  // The average moved away from the final weights: it is not a copy of them.
  const auto final_weights = read_all(root_ / "recurrence/checkpoint-8/trainable.safetensors");
  double moved = 0;
  for (const auto& [name, s] : reference) moved += (s - final_weights.at(name).to(at::kDouble)).abs().sum().item<double>();
  EXPECT_GT(moved, 0.0);
}

// 8 steps in one run equal 4, an interruption, a resume and 4 more: the average too, bit for bit.
TEST_F(EmaTrainerTest, ResumeIsExact) {
  const std::vector<std::string> ema{"--use_ema=true", "--ema_decay=0.9"};
  const auto once = run_training(config("once", ema), quiet_hooks());
  std::atomic<bool> stop{false};
  auto hooks = quiet_hooks();
  hooks.stop_requested = &stop;
  hooks.on_step = [&](const StepRecord& r) {
    if (r.step == 4) stop = true;
  };
  const auto first = run_training(config("split", ema), hooks);
  ASSERT_TRUE(first.interrupted);
  EXPECT_TRUE(fs::exists(ema_file(first.last_checkpoint)));
  const auto second = run_training(config("split", ema), quiet_hooks());
  ASSERT_EQ(second.final_step, 8);
  ASSERT_FALSE(once.ema_weights_path.empty());
  EXPECT_EQ(fs::path(once.ema_weights_path), root_ / "once" / kEmaLoraFolder / kLoraWeightsFile);
  for (const auto& [a, b] : {std::pair{ema_file(once.last_checkpoint), ema_file(second.last_checkpoint)},
                             std::pair{fs::path(once.ema_weights_path), fs::path(second.ema_weights_path)}}) {
    const auto x = read_all(a), y = read_all(b);
    ASSERT_EQ(x.size(), y.size()) << a;
    for (const auto& [name, t] : x) EXPECT_TRUE(torch::equal(t, y.at(name))) << a << ": " << name;
  }
}

// The final files: the EMA adapter beside the trained one, with the same keys and metadata; at
// ema_decay 0 the average is the weights themselves, bit for bit, at 0.9 it is not. A run without
// use_ema writes neither, and its training is the same: EMA changes no weight.
TEST_F(EmaTrainerTest, FinalFilesSitBesideTheTrainedWeights) {
  const auto plain = run_training(config("plain"), quiet_hooks());
  EXPECT_TRUE(plain.ema_weights_path.empty());
  EXPECT_FALSE(fs::exists(root_ / "plain" / kEmaLoraFolder));
  EXPECT_FALSE(fs::exists(ema_file(plain.last_checkpoint)));

  const auto copy = run_training(config("copy", {"--use_ema=true", "--ema_decay=0"}), quiet_hooks());
  const auto smooth = run_training(config("smooth", {"--use_ema=true", "--ema_decay=0.9"}), quiet_hooks());
  const auto trained = read_all(plain.weights_path);
  for (const auto* run : {&copy, &smooth}) {
    const auto weights = read_all(run->weights_path);
    for (const auto& [name, t] : trained) EXPECT_TRUE(torch::equal(t, weights.at(name))) << "EMA changed " << name;
    const auto file = io::SafetensorsFile::open(run->ema_weights_path);
    EXPECT_EQ(file.metadata(), io::SafetensorsFile::open(run->weights_path).metadata());
  }
  const auto copied = read_all(copy.ema_weights_path), smoothed = read_all(smooth.ema_weights_path);
  ASSERT_EQ(copied.size(), trained.size());
  bool any_differs = false;
  for (const auto& [name, t] : trained) {
    EXPECT_TRUE(torch::equal(t, copied.at(name))) << name;
    any_differs = any_differs || !torch::equal(t, smoothed.at(name));
  }
  EXPECT_TRUE(any_differs);

  const auto full = run_training(config("full", {"--model_type=full", "--max_train_steps=2", "--use_ema=true"}),
                                 quiet_hooks());
  EXPECT_EQ(fs::path(full.ema_weights_path),
            root_ / "full" / kEmaCheckpointFolder / fs::path(kFullWeightsFile).filename());
  EXPECT_EQ(read_all(full.ema_weights_path).size(), read_all(full.weights_path).size());
}

// On the CPU the average lives beside the weights: every step's peak is the run without EMA's plus
// exactly the memory model's EMA bytes (trainable parameters x 4).
TEST_F(EmaTrainerTest, StepPeakGrowsByThePredictedEmaBytes) {
  for (const std::string model_type : {"lora", "full"}) {
    const std::vector<std::string> common{"--model_type=" + model_type, "--max_train_steps=3"};
    auto with = common;
    with.push_back("--use_ema=true");
    const TrainConfig ema_config = config(model_type + "-ema", with);
    const auto plain = run_training(config(model_type + "-plain", common), quiet_hooks());
    const auto ema = run_training(ema_config, quiet_hooks());

    TransformerSpec spec;
    spec.family = "flux";
    spec.flavour = "flux-tiny";
    ModelUse use;
    use.training = true;
    if (model_type == "lora") {
      use.lora_rank = 4;
      use.lora_target = "all";
    }
    use.ema = ema_lives_on(ema_config, at::Device(at::kCPU));
    ASSERT_TRUE(use.ema);
    const auto demand = predict_model_memory(spec, use);
    ASSERT_TRUE(demand.has_value());
    EXPECT_EQ(demand->ema_bytes, demand->trainable * 4);
    ASSERT_EQ(plain.records.size(), ema.records.size());
    for (size_t i = 0; i < plain.records.size(); ++i) {
      EXPECT_EQ(ema.records[i].peak_bytes - plain.records[i].peak_bytes, demand->ema_bytes)
          << model_type << " step " << i + 1;
    }
    std::cout << "[ figures  ] " << model_type << ": step peak " << plain.summary.peak_bytes << " B without EMA, "
              << ema.summary.peak_bytes << " B with; predicted EMA bytes " << demand->ema_bytes << "\n";
  }
}

// The auto planner profiles with the average allocated: on the CPU its predicted peak of the same
// layout is the one without EMA plus the EMA bytes (the log rounds to 0.01 MiB).
TEST_F(EmaTrainerTest, ThePlannerCountsTheAverage) {
  const auto predicted_peak = [&](const std::string& output, std::vector<std::string> extra) {
    std::vector<std::string> lines;
    TrainerHooks hooks = quiet_hooks();
    hooks.log = [&](const std::string& line) { lines.push_back(line); };
    extra.insert(extra.end(), {"--model_type=full", "--gradient_checkpointing_interval=auto",
                               "--gradient_checkpointing_memory_budget=1073741824", "--max_train_steps=1"});
    run_training(config(output, extra), hooks);
    for (const auto& line : lines) {
      const size_t at = line.find("predicted peak ");
      if (line.find("gradient_checkpointing_interval auto:") == std::string::npos || at == std::string::npos) continue;
      EXPECT_NE(line.find(" MiB of "), std::string::npos) << line;
      return std::stod(line.substr(at + 15)) * 1024 * 1024;
    }
    ADD_FAILURE() << "no plan line";
    return 0.0;
  };
  const double without = predicted_peak("plan-plain", {}), with = predicted_peak("plan-ema", {"--use_ema=true"});
  TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = "flux-tiny";
  ModelUse use;
  use.training = true;
  use.ema = true;
  const int64_t ema_bytes = predict_model_memory(spec, use)->ema_bytes;
  EXPECT_NEAR(with - without, static_cast<double>(ema_bytes), 0.01 * 1024 * 1024);
}

// SimpleTuner's configs carry ema_* at any value with use_ema false: no warning, nothing changes.
// ema_cpu_only means ema_device cpu, as SimpleTuner's configure_args sets it.
TEST_F(EmaTrainerTest, SettingsWithoutUseEmaAreQuietAndCpuOnlyMeansCpu) {
  std::vector<std::string> warnings;
  load_train_config({"--model_family=flux", "--model_flavour=flux-tiny", "--ema_decay=0.999",
                     "--ema_update_interval=5", "--ema_device=accelerator", "--output_dir=" + (root_ / "q").string(),
                     "--instance_data_dir=" + (root_ / "data").string()},
                    warnings);
  for (const auto& w : warnings) EXPECT_EQ(w.find("ema_"), std::string::npos) << w;
  const TrainConfig cpu = config("cpu", {"--use_ema=true", "--ema_device=accelerator", "--ema_cpu_only=true"});
  EXPECT_EQ(cpu.ema_device, "cpu");
  EXPECT_FALSE(ema_settings(cpu).on_training_device);
}

}  // namespace ema_trainer_test
}  // namespace
}  // namespace remat::train
