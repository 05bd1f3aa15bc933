// Resumable training checkpoints and run reporting.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/train/optimizers/optimizer.h"
#include "remat/train/run/progress.h"
#include "remat/train/run/training_state.h"
#include "temp_dir.h"

namespace remat::train {
namespace {
namespace training_state_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)
namespace fs = std::filesystem;

using remat::testing::TempDir;

std::vector<std::pair<std::string, at::Tensor>> named(const torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

void optimizer_steps(torch::nn::Linear& model, torch::optim::Optimizer& opt, int steps, int64_t seed) {
  torch::manual_seed(seed);  // also the stochastic rounding of adamw_bf16
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    model->forward(torch::randn({4, 3})).pow(2).sum().backward();
    opt.step();
  }
}

// Every optimizer remat builds: 3 steps, save its state, a fresh optimizer restored from it, 3
// more steps equal 6 steps in one go, bit for bit.
TEST(TrainingState, OptimizerStateRoundTripContinuesIdentically) {
  for (const std::string& name : optimizer_names()) {
    torch::manual_seed(0);
    torch::nn::Linear reference(3, 2), resumed(3, 2);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < reference->parameters().size(); ++i) {
        resumed->parameters()[i].copy_(reference->parameters()[i]);
      }
    }
    OptimizerSettings settings = OptimizerSettings::defaults_of(name, 1e-2);
    settings.weight_decay = 0.1;
    auto opt_ref = make_optimizer(reference->parameters(), settings);
    optimizer_steps(reference, *opt_ref, 3, 1);
    optimizer_steps(reference, *opt_ref, 3, 2);

    auto opt_a = make_optimizer(resumed->parameters(), settings);
    optimizer_steps(resumed, *opt_a, 3, 1);
    const auto saved = optimizer_state(*opt_a, named(*resumed));
    const size_t fields = name == "torch-adamw" ? 3 : name == "adamw_bf16" ? 5 : 1;
    ASSERT_EQ(saved.size(), 2 * fields) << name;  // weight and bias
    auto opt_b = make_optimizer(resumed->parameters(), settings);  // a fresh optimizer, as on resume
    EXPECT_FALSE(optimizer_has_state(*opt_b));
    restore_optimizer_state(*opt_b, named(*resumed), saved);
    EXPECT_TRUE(optimizer_has_state(*opt_b));
    optimizer_steps(resumed, *opt_b, 3, 2);
    for (size_t i = 0; i < reference->parameters().size(); ++i) {
      EXPECT_TRUE(torch::equal(reference->parameters()[i], resumed->parameters()[i])) << name;
    }
  }
}

TEST(TrainingState, RestoreRejectsWrongShapes) {
  for (const std::string& name : {std::string("torch-adamw"), std::string("optimi-lion")}) {
    torch::nn::Linear model(3, 2);
    auto opt = make_optimizer(model->parameters(), OptimizerSettings::defaults_of(name, 1e-3));
    std::vector<io::NamedTensor> bad{{"weight.exp_avg", torch::zeros({5})},
                                     {"weight.exp_avg_sq", torch::zeros({5})},
                                     {"weight.step", torch::tensor(1, torch::kLong)}};
    try {
      restore_optimizer_state(*opt, named(*model), bad);
      FAIL() << name;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("of 'weight' has shape [5]"), std::string::npos) << e.what();
    }
  }
}

TEST(TrainingState, SaveLoadListPruneAndLatest) {
  TempDir dir;
  EXPECT_FALSE(resolve_resume_path("latest", dir.str()).has_value());
  for (int64_t step : {5, 10, 15}) {
    TrainingCheckpoint ckpt;
    ckpt.position = {step, 1, 3};
    ckpt.trainable = {{"w", torch::full({2}, static_cast<double>(step))}};
    ckpt.rng = {{"cpu", torch::arange(4, torch::kUInt8)}};
    ckpt.facts = {{"model_family", "flux"}};
    const auto path = save_training_checkpoint(dir.str(), ckpt);
    EXPECT_EQ(fs::path(path).filename(), "checkpoint-" + std::to_string(step));
  }
  const auto all = list_training_checkpoints(dir.str());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(fs::path(*resolve_resume_path("latest", dir.str())).filename(), "checkpoint-15");

  const auto loaded = load_training_checkpoint(all[1]);
  EXPECT_EQ(loaded.position.global_step, 10);
  EXPECT_EQ(loaded.position.epoch, 1);
  EXPECT_EQ(loaded.position.batch_in_epoch, 3);
  EXPECT_EQ(loaded.facts.at("model_family"), "flux");
  ASSERT_EQ(loaded.trainable.size(), 1u);
  EXPECT_TRUE(torch::equal(loaded.trainable[0].second, torch::full({2}, 10.0)));

  const auto removed = prune_training_checkpoints(dir.str(), 2);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(fs::path(removed[0]).filename(), "checkpoint-5");
  EXPECT_EQ(list_training_checkpoints(dir.str()).size(), 2u);
  // Nothing temporary is left behind.
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename().string().rfind("checkpoint-", 0), 0u) << entry.path();
  }
}

TEST(TrainingState, ResavingAStepReplacesIt) {
  TempDir dir;
  TrainingCheckpoint ckpt;
  ckpt.position.global_step = 7;
  ckpt.trainable = {{"w", torch::zeros({1})}};
  save_training_checkpoint(dir.str(), ckpt);
  ckpt.trainable = {{"w", torch::ones({1})}};
  const auto path = save_training_checkpoint(dir.str(), ckpt);
  EXPECT_TRUE(torch::equal(load_training_checkpoint(path).trainable[0].second, torch::ones({1})));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(TrainingState, BadResumePathIsAClearError) {
  TempDir dir;
  try {
    resolve_resume_path((dir.path() / "nope").string(), dir.str());
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("resume_from_checkpoint must be 'latest' or an existing"), std::string::npos);
  }
  fs::create_directories(dir.path() / "checkpoint-3");
  EXPECT_THROW(load_training_checkpoint((dir.path() / "checkpoint-3").string()), c10::Error);
}

TEST(Progress, MetricsFileHasOneJsonRecordPerStep) {
  TempDir dir;
  const auto path = (dir.path() / "metrics.jsonl").string();
  {
    MetricsWriter writer(path, /*append=*/false);
    writer.write({1, 0.5, 1e-4, 2.0, 0.25, 1024});
    writer.write({2, 0.4, 1e-4, 1.5, 0.20, 2048});
  }
  { MetricsWriter(path, /*append=*/true).write({3, 0.3, 1e-4, 1.0, 0.2, 4096}); }
  std::ifstream in(path);
  std::string line;
  int64_t expected_step = 1;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line);
    EXPECT_EQ(record.at("step").get<int64_t>(), expected_step++);
    for (const char* key : {"loss", "learning_rate", "grad_norm", "step_seconds", "peak_bytes"}) {
      EXPECT_TRUE(record.contains(key)) << key;
    }
  }
  EXPECT_EQ(expected_step, 4);
}

TEST(Progress, DurationsAndSummary) {
  EXPECT_EQ(format_duration(0.85), "850ms");
  EXPECT_EQ(format_duration(12.34), "12.3s");
  EXPECT_EQ(format_duration(65), "1m05s");
  EXPECT_EQ(format_duration(3725), "1h2m05s");
  std::vector<StepRecord> records;
  for (int i = 1; i <= 20; ++i) records.push_back({i, 1.0 / i, 1e-4, 0, 0.1 * i, 100 * i});
  const auto s = summarize(records);
  EXPECT_EQ(s.steps, 20);
  EXPECT_EQ(s.peak_bytes, 2000);
  EXPECT_NEAR(s.median_step_seconds, 1.05, 1e-12);
  double head = 0, tail = 0;
  for (int i = 1; i <= 10; ++i) head += 1.0 / i;
  for (int i = 11; i <= 20; ++i) tail += 1.0 / i;
  EXPECT_NEAR(s.initial_loss_avg, head / 10, 1e-12);
  EXPECT_NEAR(s.final_loss, tail / 10, 1e-12);
}

TEST(Progress, PlainLinesWhenNotATerminal) {
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* stream = open_memstream(&buffer, &size);
  {
    ProgressReporter reporter(4, /*is_terminal=*/false, stream, /*log_every=*/2);
    for (int64_t i = 1; i <= 4; ++i) reporter.update({i, 0.5, 1e-4, 0, 0.5, 1 << 20});
    reporter.finish();
  }
  std::fclose(stream);
  const std::string text(buffer, size);
  std::free(buffer);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_NE(text.find("step 1/4 loss 0.5000 lr 1.0e-04 500ms/step ETA 1.5s peak 1.00 MiB\n"), std::string::npos) << text;
  EXPECT_NE(text.find("step 2/4"), std::string::npos);
  EXPECT_EQ(text.find("step 3/4"), std::string::npos);
  EXPECT_NE(text.find("step 4/4"), std::string::npos);
}

}  // namespace training_state_test
}  // namespace
}  // namespace remat::train
