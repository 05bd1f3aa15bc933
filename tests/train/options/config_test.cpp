// Reading options into a TrainConfig: config.json, every command-line form, override precedence,
// unknown keys, cross-option rules and byte-size parsing.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include "remat/train/options/config.h"
#include "remat/train/options/options.h"

namespace remat::train {
namespace {
namespace config_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

const Environment kCpu{false};
const Environment kCuda{true};

// A config.json in the temporary directory, removed at the end of the test.
class TempJson {
 public:
  explicit TempJson(const std::string& text) {
    path_ = ::testing::TempDir() + "remat_train_config_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
    std::ofstream(path_) << text;
  }
  ~TempJson() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TrainConfig load(const std::vector<std::string>& args, std::vector<std::string>* warnings_out = nullptr,
                 const Environment& env = kCpu) {
  std::vector<std::string> warnings;
  TrainConfig c = load_train_config(args, warnings, env);
  if (warnings_out) *warnings_out = warnings;
  return c;
}

// Runs `fn`, expecting a ValidationError whose message contains every fragment.
template <class Fn>
void expect_error(Fn fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const ValidationError& e) {
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

bool contains(const std::vector<std::string>& warnings, const std::string& fragment) {
  for (const auto& w : warnings) {
    if (w.find(fragment) != std::string::npos) return true;
  }
  return false;
}

TEST(CommandLine, EveryForm) {
  const auto c = load({"--lora_rank=32", "--learning_rate", "1e-4", "--model_type=lora",
                       "--flow_use_uniform_schedule", "--gradient_checkpointing=false",
                       "--seed", "7", "--model_family", "mageflow"});
  EXPECT_EQ(c.lora_rank, 32);
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-4);
  EXPECT_EQ(c.model_type, "lora");
  EXPECT_TRUE(c.flow_use_uniform_schedule);
  EXPECT_FALSE(c.gradient_checkpointing);
  EXPECT_EQ(c.seed, 7);
  EXPECT_EQ(c.model_family, "mageflow");
  // A value that starts with '-' is the value, not a flag (seeds are in [0, 2^32 - 1]).
  expect_error([] { load({"--seed", "-7"}); }, {"seed must be an integer in [0, 4294967295]", "got '-7'"});
}

TEST(CommandLine, BoolFlagFollowedByAWordOrAnotherFlag) {
  EXPECT_FALSE(load({"--gradient_checkpointing", "false"}).gradient_checkpointing);
  EXPECT_TRUE(load({"--gradient_checkpointing", "--model_type=lora", "--lora_rank=8"}).gradient_checkpointing);
  const auto c = load({"--flow_use_uniform_schedule", "--lora_rank", "8", "--model_type", "lora"});
  EXPECT_TRUE(c.flow_use_uniform_schedule);
  EXPECT_EQ(c.lora_rank, 8);
}

TEST(CommandLine, DefaultsWhenNothingIsGiven) {
  std::vector<std::string> warnings;
  const auto c = load({}, &warnings);
  const TrainConfig d;
  EXPECT_EQ(c.model_family, "flux");
  EXPECT_EQ(c.model_flavour, "krea");  // resolved from the family: SimpleTuner's default
  EXPECT_EQ(c.model_type, "full");     // SimpleTuner's default
  EXPECT_EQ(c.optimizer, "adamw_bf16");
  EXPECT_EQ(c.lora_rank, d.lora_rank);
  EXPECT_DOUBLE_EQ(*c.lora_alpha, 16.0);  // = rank when unset
  EXPECT_EQ(c.device, "cpu");             // auto without CUDA
  EXPECT_EQ(load({}, nullptr, kCuda).device, "cuda");
  // krea without a path means its hub id (resolve_hub_models), never random weights in silence.
  EXPECT_FALSE(contains(warnings, "random weights"));
  EXPECT_EQ(c.resume_from_checkpoint, "latest");
}

TEST(CommandLine, ErrorsForUnknownFlagsMissingValuesAndPositionals) {
  expect_error([] { load({"--lora_rnk=4"}); }, {"unknown option 'lora_rnk'", "did you mean 'lora_rank'?"});
  expect_error([] { load({"--lora_rank"}); }, {"--lora_rank must be followed by a value"});
  expect_error([] { load({"train.json"}); }, {"got 'train.json'"});
  expect_error([] { load({"--config"}); }, {"--config must be followed by a path"});
  EXPECT_TRUE(parse_command_line({"--help"}).help);
  EXPECT_FALSE(parse_command_line({"--lora_rank=2"}).help);
}

TEST(ConfigJson, KeysWithAndWithoutDashesAndTypedValues) {
  TempJson json(R"({
    "--model_family": "flux",
    "model_type": "lora",
    "--lora_rank": 8,
    "lora_alpha": 4.0,
    "learning_rate": 0.0001,
    "gradient_checkpointing": true,
    "--gradient_checkpointing_interval": 3,
    "gradient_checkpointing_segment_stride": "5",
    "seed": null,
    "checkpointing_steps": 250,
    "gradient_checkpointing_backend": "unsloth"
  })");
  std::vector<std::string> warnings;
  const auto c = load({"--config", json.path()}, &warnings, kCuda);
  EXPECT_EQ(c.model_type, "lora");
  EXPECT_EQ(c.lora_rank, 8);
  EXPECT_DOUBLE_EQ(*c.lora_alpha, 4.0);
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-4);
  EXPECT_EQ(c.gradient_checkpointing_interval.chunk(), 3);
  EXPECT_EQ(c.gradient_checkpointing_segment_stride, 5);
  EXPECT_FALSE(c.seed.has_value());
  EXPECT_EQ(c.checkpoint_step_interval, 250);  // SimpleTuner's older name is an alias
  EXPECT_EQ(c.checkpoint_backend(), Backend::Offload);
  EXPECT_FALSE(c.checkpoint_ffn_only());
}

TEST(ConfigJson, FlagsOverrideTheFileInEitherOrder) {
  TempJson json(R"({"model_type": "lora", "lora_rank": 8, "learning_rate": 0.001, "gradient_checkpointing": true})");
  const auto a = load({"--lora_rank=4", "--config", json.path(), "--gradient_checkpointing=false"});
  EXPECT_EQ(a.lora_rank, 4);  // flag given before --config still wins
  EXPECT_DOUBLE_EQ(a.learning_rate, 1e-3);
  EXPECT_FALSE(a.gradient_checkpointing);
  const auto b = load({"--config=" + json.path(), "--lora_rank", "2", "--lora_rank=3"});
  EXPECT_EQ(b.lora_rank, 3);  // the last flag wins
}

TEST(ConfigJson, Errors) {
  {
    TempJson json(R"({"lora_rank": 8, "gradient_checkpointing_intervl": 2})");
    expect_error([&] { load({"--config", json.path()}); },
                 {"unknown option 'gradient_checkpointing_intervl'",
                  "did you mean 'gradient_checkpointing_interval'?"});
  }
  {
    TempJson json(R"({"lora_rank": true})");
    expect_error([&] { load({"--config", json.path()}); }, {"lora_rank must be an integer in [1, 4096]", "got 'true'"});
  }
  {
    TempJson json(R"({"lora_rank": [1, 2]})");
    expect_error([&] { load({"--config", json.path()}); }, {"lora_rank must be a single value", "[1,2]"});
  }
  {
    TempJson json(R"({"lora_rank": 4, "--lora_rank": 8})");
    expect_error([&] { load({"--config", json.path()}); }, {"lora_rank must be given once"});
  }
  {
    TempJson json(R"([1, 2])");
    expect_error([&] { load({"--config", json.path()}); }, {"config must be a JSON object", "got a array"});
  }
  {
    TempJson json(R"({"lora_rank": )");
    expect_error([&] { load({"--config", json.path()}); }, {"config '" + json.path() + "' is not valid JSON"});
  }
  expect_error([] { load({"--config", "/nonexistent/remat.json"}); },
               {"config must be a readable JSON file, got '/nonexistent/remat.json'"});
  expect_error([] { load({"--config", "/nonexistent/remat.yaml"}); },
               {"config must be a .json, .toml or .env file", "got '/nonexistent/remat.yaml'"});
}

// Note [Bounded JSON]: a 100k-deep value once overflowed the stack (the error message dumped it
// recursively); a FIFO as --config once blocked forever in open().
TEST(ConfigJson, DeepValuesAndFifosAreRefused) {
  {
    TempJson json("{\"seed\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
    expect_error([&] { load({"--config", json.path()}); },
                 {"[train] config '" + json.path() + "' nests arrays and objects deeper than 64 levels"});
  }
  {
    TempJson json("{\"seed\": [[[[[[[1]]]]]]]}");
    expect_error([&] { load({"--config", json.path()}); }, {"seed must be a single value", "got [[[[[...]]]]]"});
  }
  {
    TempJson json("{\"" + std::string(1 << 20, 'k') + "\": 1}");  // a 1 MiB key
    expect_error([&] { load({"--config", json.path()}); }, {"unknown option 'kkkk", "(1048576 bytes)"});
  }
  const std::string fifo = ::testing::TempDir() + "remat_config_fifo.json";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { load({"--config", fifo}); }, {"config must be a readable JSON file", "(a FIFO)"});
  std::remove(fifo.c_str());
}

TEST(BuildConfig, CrossOptionRules) {
  std::vector<std::string> warnings;
  EXPECT_EQ(build_train_config({{"model_family", "mageflow"}}, warnings, kCpu).model_flavour, "base");
  EXPECT_EQ(build_train_config({{"model_flavour", "flux-tiny"}}, warnings, kCpu).model_flavour, "flux-tiny");
  EXPECT_EQ(build_train_config({{"model_flavour", "flux-dev"}}, warnings, kCpu).model_flavour, "dev");
  expect_error([&] { build_train_config({{"model_flavour", "mageflow-tiny"}}, warnings, kCpu); },
               {"model_flavour must be one of krea, dev, schnell, kontext, fluxbooru, libreflux, flux-tiny, "
                "flux-small for model_family flux",
                "got 'mageflow-tiny'"});
  expect_error([&] { build_train_config({{"device", "cuda"}}, warnings, kCpu); },
               {"device must be cpu or auto on this machine", "got 'cuda'"});
  EXPECT_EQ(build_train_config({{"device", "cuda"}}, warnings, kCuda).device, "cuda");
  EXPECT_EQ(build_train_config({{"device", "cpu"}}, warnings, kCuda).device, "cpu");

  warnings.clear();
  const auto c = build_train_config({{"lr_scheduler", "constant"}, {"lr_warmup_steps", "10"}}, warnings, kCpu);
  EXPECT_EQ(c.lr_scheduler, "constant_with_warmup");  // as SimpleTuner's normalize_lr_scheduler_value
  EXPECT_EQ(build_train_config({{"lr_scheduler", "constant"}}, warnings, kCpu).lr_scheduler, "constant");
}

TEST(BuildConfig, IntervalAutoAndBudget) {
  std::vector<std::string> warnings;
  const auto c = load({"--gradient_checkpointing_interval=auto", "--gradient_checkpointing_memory_budget=20GiB"},
                      &warnings);
  EXPECT_TRUE(c.gradient_checkpointing_interval.is_auto());
  EXPECT_FALSE(c.gradient_checkpointing_interval.chunk().has_value());
  EXPECT_EQ(c.gradient_checkpointing_memory_budget, int64_t{20} << 30);
  EXPECT_FALSE(contains(warnings, "memory_budget"));
  // A later numeric value replaces auto.
  const auto d = load({"--gradient_checkpointing_interval=auto", "--gradient_checkpointing_interval=4"});
  EXPECT_FALSE(d.gradient_checkpointing_interval.is_auto());
  EXPECT_EQ(d.gradient_checkpointing_interval.chunk(), 4);
}

TEST(ByteSizes, UnitsAndErrors) {
  EXPECT_EQ(parse_bytes("20GiB"), 20LL * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_bytes("512MiB"), 512LL * 1024 * 1024);
  EXPECT_EQ(parse_bytes("1.5GB"), 1500000000LL);
  EXPECT_EQ(parse_bytes("1.5 gib"), 3LL * 512 * 1024 * 1024);
  EXPECT_EQ(parse_bytes("64k"), 65536);
  EXPECT_EQ(parse_bytes("2KB"), 2000);
  EXPECT_EQ(parse_bytes("1048576"), 1048576);
  EXPECT_EQ(parse_bytes("7B"), 7);
  EXPECT_EQ(parse_bytes("2TiB"), 2LL << 40);
  EXPECT_EQ(parse_bytes("0.1KiB"), 102);  // rounded down
  for (const char* bad : {"", "GiB", "-1GiB", "20 GiBs", "1.5", "1e9", "twenty", "20GiB extra", "1.2.3MB"}) {
    expect_error([&] { parse_bytes(bad); },
                 {"gradient_checkpointing_memory_budget must be", "got '" + std::string(bad) + "'"});
  }
  expect_error([] { parse_bytes("9000000TiB", "budget"); }, {"[train] budget must be at most 8EiB"});
  for (int64_t v : {int64_t{1}, int64_t{1023}, int64_t{1024}, int64_t{3} << 29, int64_t{20} << 30, int64_t{1500000000}}) {
    EXPECT_EQ(parse_bytes(format_byte_size(v)), v) << format_byte_size(v);
  }
  EXPECT_EQ(format_byte_size(int64_t{20} << 30), "20GiB");
}

TEST(TrainConfigHelpers, BackendAndScope) {
  TrainConfig c;
  const std::vector<std::tuple<std::string, Backend, bool>> rows{
      {"torch", Backend::Recompute, false},
      {"unsloth", Backend::Offload, false},
      {"torch-ffn", Backend::Recompute, true},
      {"unsloth-ffn", Backend::Offload, true}};
  for (const auto& [name, backend, ffn] : rows) {
    c.gradient_checkpointing_backend = name;
    EXPECT_EQ(c.checkpoint_backend(), backend) << name;
    EXPECT_EQ(c.checkpoint_ffn_only(), ffn) << name;
  }
  c.lora_rank = 32;
  EXPECT_EQ(c.lora_alpha_value(), 32.0);
  c.lora_alpha = 8.0;
  EXPECT_EQ(c.lora_alpha_value(), 8.0);
}

}  // namespace config_test
}  // namespace
}  // namespace remat::train
