// A SimpleTuner user's config: every key classified (remat's option, a SimpleTuner option remat
// ignores or refuses, unknown), SimpleTuner's vocabulary, null and integral floats, the three file
// formats, and the SimpleTuner-style test configs validated as written.
//
// tests/train/options/simpletuner_example_keys.txt lists every key of SimpleTuner's 114 example
// configs (its header says how it was made); tests/cli/simpletuner_configs/ holds configs written
// for the tests that together use all of them (their README says how they were derived).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "remat/models/quantization.h"
#include "remat/train/options/config.h"
#include "remat/train/options/options.h"
#include "remat/train/options/simpletuner.h"
#include "temp_dir.h"
#include "test_paths.h"

namespace remat::train {
namespace {
namespace simpletuner_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)
namespace fs = std::filesystem;

const Environment kCpu{false};
const fs::path kSource(remat::testing::source_dir());
const fs::path kConfigs = kSource / "tests/cli/simpletuner_configs";

std::vector<std::string> example_keys() {
  std::ifstream in(kSource / "tests/train/options/simpletuner_example_keys.txt");
  std::vector<std::string> keys;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') keys.push_back(line);
  }
  return keys;
}

std::vector<std::string> errors_of(const ValidationReport& r) {
  std::vector<std::string> out;
  for (const auto& e : r.errors()) out.push_back(e.message);
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

bool contains(const std::vector<std::string>& lines, const std::string& fragment) {
  for (const auto& l : lines) {
    if (l.find(fragment) != std::string::npos) return true;
  }
  return false;
}

// The one grouped warning about SimpleTuner options, if any.
std::vector<std::string> grouped_warnings(const ValidationReport& r) {
  std::vector<std::string> out;
  for (const auto& w : r.warnings()) {
    if (w.find("that remat does not implement") != std::string::npos) out.push_back(w);
  }
  return out;
}

TEST(SimpleTunerKeys, EveryKeyOfTheExamplesIsClassified) {
  const auto keys = example_keys();
  ASSERT_EQ(keys.size(), 165u);
  int implemented = 0, ignored = 0, refused = 0;
  std::vector<std::string> unknown;
  for (const auto& key : keys) {
    if (find_option(key) != nullptr) {
      ++implemented;
    } else if (const SimpleTunerOption* st = find_simpletuner_option(key)) {
      (st->changes_training ? refused : ignored)++;
    } else {
      unknown.push_back(key);
    }
  }
  EXPECT_TRUE(unknown.empty()) << joined(unknown);
  std::cout << "[ SimpleTuner example keys ] " << keys.size() << ": " << implemented << " implemented, "
            << ignored << " ignored with the grouped warning, " << refused
            << " refused when set to a value that changes training, " << unknown.size() << " unknown\n";
}

TEST(SimpleTunerKeys, TheTestConfigsUseEveryExampleKey) {
  std::set<std::string> used;
  for (const auto& entry : fs::directory_iterator(kConfigs)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".json") continue;
    std::ifstream in(entry.path());
    const auto doc = nlohmann::json::parse(in);
    for (const auto& [key, value] : doc.items()) used.insert(key);
  }
  for (const auto& key : example_keys()) EXPECT_TRUE(used.count(key)) << key << " is in no test config";
}

// The SimpleTuner-style configs as written (no flags): only unsupported-computation errors, for
// exactly the keys EXPECTED names; the others validate with the grouped warning.
TEST(SimpleTunerKeys, TheTestConfigsValidateAsWritten) {
  std::ifstream in(kConfigs / "EXPECTED");
  int checked = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string file, outcome, key;
    words >> file;
    // "float8:" / "no-float8:" lines hold for one kind of build only (EXPECTED's header).
    if (file.back() == ':') {
      if (file != (models::float8_supported() ? "float8:" : "no-float8:")) continue;
      words >> file;
    }
    words >> outcome;
    std::set<std::string> want;
    while (words >> key) want.insert(key);
    const ValidationReport r = validate_option_values(read_config_file((kConfigs / file).string()), kCpu);
    std::set<std::string> named;
    for (const auto& e : r.errors()) {
      EXPECT_NE(e.message.find("is not supported by remat yet"), std::string::npos) << file << ": " << e.message;
      named.insert(e.option);
    }
    EXPECT_EQ(named, want) << file;
    EXPECT_EQ(grouped_warnings(r).size(), 1u) << file << "\n" << joined(r.warnings());
    ++checked;
  }
  EXPECT_EQ(checked, 18);
}

// Each row of the data file agrees with the registry.
TEST(SimpleTunerKeys, TheTableAgreesWithTheRegistry) {
  std::set<std::string> groups;
  for (const auto& [group, title] : simpletuner_groups()) groups.insert(group);
  for (const auto& st : simpletuner_options()) {
    if (st.group == "remat") {
      EXPECT_NE(find_option(st.name), nullptr) << st.name << " is marked as implemented";
    } else {
      EXPECT_EQ(find_option(st.name), nullptr) << st.name << " is implemented but grouped as " << st.group;
      EXPECT_TRUE(groups.count(st.group)) << st.name << ": group " << st.group;
    }
    if (st.changes_training) {
      EXPECT_FALSE(st.effect.empty()) << st.name;
    }
  }
  // remat's own options (not SimpleTuner's names).
  const std::set<std::string> own = {"pretrained_transformer_config", "instance_data_dir", "crop", "crop_style",
                                     "crop_aspect",
                                     "gradient_checkpointing_memory_budget", "device", "report_every",
                                     "ignore_unsupported_options", "skip_memory_check"};
  for (const auto& spec : option_specs()) {
    const SimpleTunerOption* st = find_simpletuner_option(spec.name);
    if (own.count(spec.name)) {
      EXPECT_EQ(st, nullptr) << spec.name;
    } else {
      ASSERT_NE(st, nullptr) << spec.name << " is not SimpleTuner's name";
      EXPECT_EQ(st->group, "remat") << spec.name;
    }
  }
  EXPECT_GT(simpletuner_options().size(), 500u);
  for (const auto& e : simpletuner_env_names()) {
    EXPECT_TRUE(find_option(e.option) || find_simpletuner_option(e.option)) << e.env << " -> " << e.option;
  }
}

TEST(SimpleTunerKeys, OneGroupedWarning) {
  const auto r = validate_option_values({{"report_to", "none"},
                                         {"validation_guidance_rescale", "0.7"},
                                         {"push_to_hub", "false"},
                                         {"--crepa_enabled", "false"},
                                         {"aspect_bucket_rounding", "2"},
                                         {"text_encoder_1_precision", "int8-quanto"}},
                                        kCpu);
  EXPECT_TRUE(r.ok()) << joined(errors_of(r));
  const auto grouped = grouped_warnings(r);
  ASSERT_EQ(grouped.size(), 1u);
  const std::string& w = grouped[0];
  EXPECT_NE(w.find("[train] 6 SimpleTuner options that remat does not implement are ignored:"), std::string::npos) << w;
  EXPECT_NE(w.find("\n    tracking and logging: report_to"), std::string::npos) << w;
  EXPECT_NE(w.find("\n    validation and evaluation: validation_guidance_rescale"), std::string::npos) << w;
  EXPECT_NE(w.find("\n    Hub publishing: push_to_hub"), std::string::npos) << w;
  EXPECT_NE(w.find("\n    extra losses and noise: crepa_enabled"), std::string::npos) << w;
  EXPECT_NE(w.find("quantisation: text_encoder_1_precision"), std::string::npos) << w;
  EXPECT_NE(w.find("datasets, buckets and captions: aspect_bucket_rounding"), std::string::npos) << w;
}

TEST(SimpleTunerKeys, KeysThatChangeTrainingAreErrorsUnlessIgnored) {
  const OptionValues values{{"base_model_precision", "int4-quanto"},
                            {"crepa_enabled", "true"},
                            {"tread_config", R"({"routes":[{"selection_ratio":0.5}]})"},
                            {"controlnet", "true"},
                            {"input_perturbation", "0.1"},
                            {"lora_type", "lycoris"}};
  const auto r = validate_option_values(values, kCpu);
  const auto errors = errors_of(r);
  ASSERT_EQ(errors.size(), 6u) << joined(errors);
  EXPECT_TRUE(contains(errors,
                       "[train] base_model_precision=int4-quanto is not supported by remat yet: it needs 4-bit "
                       "integer weights with group scales (optimum-quanto qint4) (remat quantises with "
                       "int8-quanto, int8-torchao, nf4-bnb, fp8-quanto, fp8wo-torchao), which remat does not "
                       "have, so remat would train something else than the config asks for. Remove it, or "
                       "pass --ignore_unsupported_options to train without it"))
      << joined(errors);
  for (const char* key : {"crepa_enabled=true", "tread_config=", "controlnet=true", "input_perturbation=0.1",
                          "lora_type=lycoris"}) {
    EXPECT_TRUE(contains(errors, key)) << key;
  }
  // Their neutral values change nothing: no error.
  const auto neutral = validate_option_values({{"base_model_precision", "no_change"},
                                               {"crepa_enabled", "false"},
                                               {"tread_config", std::nullopt},
                                               {"controlnet", "0"},
                                               {"input_perturbation", "0.0"},
                                               {"lora_type", "standard"},
                                               {"lora_dropout", "0"}},
                                              kCpu);
  EXPECT_TRUE(neutral.ok()) << joined(errors_of(neutral));
  // --ignore_unsupported_options: trains, and the warning says what it ignored.
  OptionValues ignoring = values;
  ignoring["ignore_unsupported_options"] = "true";
  const auto ignored = validate_option_values(ignoring, kCpu);
  EXPECT_TRUE(ignored.ok()) << joined(errors_of(ignored));
  const auto grouped = grouped_warnings(ignored);
  ASSERT_EQ(grouped.size(), 1u);
  EXPECT_NE(grouped[0].find("ignored because of --ignore_unsupported_options: base_model_precision=int4-quanto "
                            "(needs 4-bit integer weights"),
            std::string::npos)
      << grouped[0];
}

TEST(SimpleTunerKeys, UnknownKeysAreOneErrorWithNearSuggestionsOnly) {
  const auto r = validate_option_values(
      {{"foo_bar", "1"}, {"lora_rnk", "2"}, {"validaton_steps", "3"}, {"data_backend_confg", "x"}}, kCpu);
  const auto errors = errors_of(r);
  ASSERT_EQ(errors.size(), 1u) << joined(errors);
  EXPECT_EQ(errors[0],
            "[train] unknown options 'data_backend_confg' (did you mean 'data_backend_config'?), 'foo_bar', "
            "'lora_rnk' (did you mean 'lora_rank'?), 'validaton_steps' (did you mean 'validation_steps'?): "
            "neither remat's nor SimpleTuner's (remat train --help lists remat's)");
  // The keys issue 10 found with misleading hints are SimpleTuner's: no error at all.
  EXPECT_TRUE(validate_option_values({{"data_backend_config", "x.json"}, {"validation_steps", "50"}, {"use_ema", "false"}},
                                     kCpu)
                  .ok());
}

TEST(SimpleTunerVocabulary, NullIsTheDefaultForEveryOption) {
  OptionValues all_null;
  for (const auto& spec : option_specs()) all_null[spec.name] = std::nullopt;
  const auto r = validate_option_values(all_null, kCpu);
  ASSERT_TRUE(r.ok()) << joined(errors_of(r));
  const auto defaults = validate_option_values({}, kCpu);
  for (const auto& spec : option_specs()) {
    EXPECT_EQ(spec.render(r.config), spec.render(defaults.config)) << spec.name;
  }
  // In a file, with and without dashes, integral floats for integers.
  remat::testing::TempDir dir;
  const std::string path = (dir.path() / "config.json").string();
  std::ofstream(path) << R"({"lr_scheduler": null, "--seed": null, "resume_from_checkpoint": null,
    "gradient_checkpointing_interval": null, "lora_rank": 16.0, "max_train_steps": 2.0, "--seed_": null})";
  std::vector<std::string> warnings;
  try {
    load_train_config({"--config", path}, warnings, kCpu);
    ADD_FAILURE() << "seed_ is no option";
  } catch (const ValidationErrors& e) {
    EXPECT_EQ(e.errors().size(), 1u) << e.what();
  }
  std::ofstream(path) << R"({"lr_scheduler": null, "--seed": 42.0, "resume_from_checkpoint": null,
    "gradient_checkpointing_interval": 2.0, "lora_rank": 16.0, "max_train_steps": 2.0, "num_train_epochs": 0})";
  const TrainConfig c = load_train_config({"--config", path}, warnings, kCpu);
  EXPECT_EQ(c.lr_scheduler, "constant_with_warmup");
  EXPECT_EQ(c.seed, 42);
  EXPECT_EQ(c.resume_from_checkpoint, "latest");  // null is the default, as SimpleTuner drops it
  std::ofstream(path) << R"({"resume_from_checkpoint": "none"})";
  EXPECT_FALSE(load_train_config({"--config", path}, warnings, kCpu).resume_from_checkpoint.has_value());
  std::ofstream(path) << R"({"lr_scheduler": null, "--seed": 42.0, "resume_from_checkpoint": null,
    "gradient_checkpointing_interval": 2.0, "lora_rank": 16.0, "max_train_steps": 2.0, "num_train_epochs": 0})";
  EXPECT_EQ(c.gradient_checkpointing_interval.chunk(), 2);
  EXPECT_EQ(c.lora_rank, 16);
  EXPECT_EQ(c.num_train_epochs, 0);
  std::ofstream(path) << R"({"lora_rank": 16.5})";
  EXPECT_THROW(load_train_config({"--config", path}, warnings, kCpu), ValidationErrors);
}

TEST(SimpleTunerVocabulary, EpochsZeroMeansMaxTrainSteps) {
  EXPECT_TRUE(validate_option_values({{"num_train_epochs", "0"}, {"max_train_steps", "100"}}, kCpu).ok());
  const auto both = validate_option_values({{"num_train_epochs", "0"}, {"max_train_steps", "0"}}, kCpu);
  EXPECT_TRUE(contains(errors_of(both), "max_train_steps or num_train_epochs must be above 0")) << joined(errors_of(both));
}

TEST(SimpleTunerVocabulary, OptimizersSchedulesAndFlavours) {
  for (const char* optimizer : {"adamw_bf16", "torch-adamw", "optimi-lion", "lion"}) {
    EXPECT_TRUE(validate_option_values({{"optimizer", optimizer}}, kCpu).ok()) << optimizer;
  }
  const auto prodigy = validate_option_values({{"optimizer", "prodigy"}}, kCpu);
  EXPECT_TRUE(contains(errors_of(prodigy), "optimizer must be one of adamw_bf16, torch-adamw, optimi-lion"));
  for (const char* schedule : {"constant", "constant_with_warmup", "linear", "polynomial", "cosine", "sine",
                               "cosine_with_restarts", "cosine_with_warmup"}) {
    const auto r = validate_option_values({{"lr_scheduler", schedule}, {"lr_warmup_steps", "10"}, {"learning_rate", "1e-4"}}, kCpu);
    EXPECT_TRUE(r.ok()) << schedule << ": " << joined(errors_of(r));
  }
  EXPECT_EQ(validate_option_values({{"lr_scheduler", "cosine_with_warmup"}}, kCpu).config.lr_scheduler, "cosine");
  EXPECT_TRUE(contains(errors_of(validate_option_values({{"lr_scheduler", "sine"}}, kCpu)),
                       "lr_warmup_steps must be >= 1 with lr_scheduler sine"));
  EXPECT_TRUE(contains(errors_of(validate_option_values({{"lr_scheduler", "polynomial"}, {"lr_end", "1e-3"},
                                                         {"learning_rate", "1e-4"}}, kCpu)),
                       "lr_end must be below learning_rate"));

  // Flavours: SimpleTuner's names; remat's small ones keep theirs.
  EXPECT_EQ(validate_option_values({}, kCpu).config.model_flavour, "krea");
  EXPECT_EQ(validate_option_values({{"model_family", "mageflow"}}, kCpu).config.model_flavour, "base");
  for (const char* flavour : {"dev", "krea", "schnell", "kontext", "fluxbooru", "flux-tiny", "flux-small"}) {
    EXPECT_TRUE(validate_option_values({{"model_flavour", flavour}}, kCpu).ok()) << flavour;
  }
  // The edit flavours train text to image with the edit template (reference pictures are refused by
  // the dataset rules instead).
  for (const char* flavour : {"base", "default", "turbo", "edit-base", "edit", "edit-turbo", "mageflow-tiny",
                              "mageflow-small"}) {
    EXPECT_TRUE(validate_option_values({{"model_family", "mageflow"}, {"model_flavour", flavour}}, kCpu).ok()) << flavour;
  }
  const auto booru = validate_option_values({{"model_flavour", "fluxbooru"}, {"flux_guidance_value", "1.0"}}, kCpu);
  EXPECT_EQ(booru.config.flux_guidance_value, 3.5);
  EXPECT_TRUE(contains(booru.warnings(), "fluxbooru trains with flux_guidance_value 3.5"));
  for (const auto& [family, flavour] : std::vector<std::pair<std::string, std::string>>{
           {"flux", "libreflux"}}) {
    const auto r = validate_option_values({{"model_family", family}, {"model_flavour", flavour}}, kCpu);
    EXPECT_TRUE(contains(errors_of(r), "model_flavour=" + flavour + " is not supported by remat yet")) << flavour;
    EXPECT_TRUE(validate_option_values({{"model_family", family}, {"model_flavour", flavour},
                                        {"ignore_unsupported_options", "true"}},
                                       kCpu)
                    .ok());
  }
  const auto target = validate_option_values({{"model_type", "lora"}, {"flux_lora_target", "controlnet"}}, kCpu);
  EXPECT_TRUE(contains(errors_of(target), "flux_lora_target=controlnet is not supported by remat yet"));
  const auto ignored = validate_option_values(
      {{"model_type", "lora"}, {"flux_lora_target", "controlnet"}, {"ignore_unsupported_options", "true"}}, kCpu);
  EXPECT_TRUE(ignored.ok());
  EXPECT_EQ(ignored.config.flux_lora_target, "all");  // back to the default
}

class ConfigFormats : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_.path() / name).string();
    std::ofstream(path) << text;
    return path;
  }
  TrainConfig load(const std::vector<std::string>& args, std::vector<std::string>* warnings = nullptr) {
    std::vector<std::string> w;
    TrainConfig c = load_train_config(args, w, kCpu);
    if (warnings) *warnings = w;
    return c;
  }
  remat::testing::TempDir dir_;
};

TEST_F(ConfigFormats, TomlByExtension) {
  const auto path = write("config.toml", R"(
model_family = "mageflow"
model_flavour = "turbo"
model_type = "lora"
"--lora_rank" = 8
learning_rate = 1e-4
gradient_checkpointing = true
gradient_checkpointing_interval = 2
report_to = "none"

[tread_config]
routes = [{ selection_ratio = 0.5, start_layer_idx = 2, end_layer_idx = -2 }]
)");
  try {
    load({"--config", path});
    ADD_FAILURE() << "tread_config is an unsupported computation";
  } catch (const ValidationErrors& e) {
    EXPECT_NE(std::string(e.what()).find("tread_config={\"routes\""), std::string::npos) << e.what();
  }
  std::vector<std::string> warnings;
  const TrainConfig c = load({"--config", path, "--ignore_unsupported_options", "--lora_rank=4"}, &warnings);
  EXPECT_EQ(c.model_family, "mageflow");
  EXPECT_EQ(c.model_flavour, "turbo");
  EXPECT_EQ(c.lora_rank, 4);  // flags override the file
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-4);
  EXPECT_EQ(c.gradient_checkpointing_interval.chunk(), 2);
  const auto bad = write("bad.toml", "lora_rank = = 3\n");
  try {
    load({"--config", bad});
    ADD_FAILURE();
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("config must be valid TOML, got '" + bad + "'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();
  }
}

TEST_F(ConfigFormats, EnvWithSimpleTunersNames) {
  const auto path = write("config.env", R"(# SimpleTuner's config.env
export MODEL_FAMILY=flux
export MODEL_TYPE='lora'
export TRAINING_SEED="7"
LEARNING_RATE=2e-4
export LR_SCHEDULE=sine
export LR_WARMUP_STEPS=20
export MAX_NUM_STEPS=30
export NUM_EPOCHS=0
export CHECKPOINTING_STEPS=10
export USE_GRADIENT_CHECKPOINTING=true
export GRADIENT_CHECKPOINTING_SEGMENT_STRIDE=4
export VALIDATION_PROMPT="a photo of a cat"
export PUSH_TO_HUB=false
export CUDA_VISIBLE_DEVICES=0
export TRAINER_EXTRA_ARGS="--lora_rank=8 --gradient_checkpointing_interval=2"
export TRAINER_EXTRA_ARGS+="--flux_lora_target=all+ffs --report_to=none"
this line is malformed
)");
  std::vector<std::string> warnings;
  const TrainConfig c = load({"--config", path}, &warnings);
  EXPECT_EQ(c.model_type, "lora");
  EXPECT_EQ(c.seed, 7);
  EXPECT_DOUBLE_EQ(c.learning_rate, 2e-4);
  EXPECT_EQ(c.lr_scheduler, "sine");
  EXPECT_EQ(c.max_train_steps, 30);
  EXPECT_EQ(c.num_train_epochs, 0);
  EXPECT_EQ(c.checkpoint_step_interval, 10);
  EXPECT_EQ(c.gradient_checkpointing_segment_stride, 4);
  EXPECT_EQ(c.lora_rank, 8);
  EXPECT_EQ(c.gradient_checkpointing_interval.chunk(), 2);
  EXPECT_EQ(c.flux_lora_target, "all+ffs");  // from the appended TRAINER_EXTRA_ARGS
  EXPECT_TRUE(contains(warnings, "sets CUDA_VISIBLE_DEVICES, which are not SimpleTuner's config.env option names"));
  EXPECT_TRUE(contains(warnings, "skipped malformed lines 18"));
  EXPECT_EQ(c.validation_prompt, "a photo of a cat");  // remat renders validation images (issue 13)
  EXPECT_TRUE(contains(warnings, "Hub publishing: push_to_hub"));
}

TEST_F(ConfigFormats, JsonAndAnyOtherExtension) {
  const auto json = write("config.json", R"({"--model_type": "lora", "lora_rank": 4})");
  EXPECT_EQ(load({"--config", json}).lora_rank, 4);
  const auto yaml = write("config.yaml", "lora_rank: 4\n");
  try {
    load({"--config", yaml});
    ADD_FAILURE();
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("config must be a .json, .toml or .env file"), std::string::npos);
  }
}

}  // namespace simpletuner_test
}  // namespace
}  // namespace remat::train
