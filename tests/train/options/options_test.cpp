// The options registry: value typing and validation rules, help text and JSON export.
#include <gtest/gtest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "remat/train/options/options.h"

namespace remat::train {
namespace {
namespace options_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

const OptionSpec& spec(const std::string& name) {
  const OptionSpec* s = find_option(name);
  if (!s) throw std::runtime_error("no option " + name);
  return *s;
}

// Asserts that parsing `text` for `option` fails with a message containing every fragment.
void expect_rejected(const std::string& option, const std::optional<std::string>& text,
                     const std::vector<std::string>& fragments) {
  try {
    parse_option_value(spec(option), text);
    ADD_FAILURE() << option << "=" << text.value_or("<null>") << " was accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.option(), option);
    const std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

TEST(OptionsRegistry, NamesAreUniqueAndCoverTheBrief) {
  std::set<std::string> names;
  for (const auto& s : option_specs()) {
    EXPECT_TRUE(names.insert(s.name).second) << "duplicate " << s.name;
    EXPECT_FALSE(s.help.empty()) << s.name;
    EXPECT_FALSE(s.section.empty()) << s.name;
    EXPECT_TRUE(s.assign && s.render) << s.name;
    if (s.type == OptionType::Choice) {
      EXPECT_FALSE(s.choices.empty()) << s.name;
    }
  }
  for (const char* n :
       {"model_family", "model_flavour", "pretrained_model_name_or_path", "pretrained_transformer_config",
        "model_type", "lora_rank", "lora_alpha", "flux_lora_target", "learning_rate", "optimizer",
        "optimizer_config", "optimizer_beta1", "optimizer_beta2", "lr_scheduler", "lr_warmup_steps",
        "lr_end", "lr_power", "grad_clip_method",
        "train_batch_size", "gradient_accumulation_steps", "max_train_steps", "seed", "mixed_precision",
        "max_grad_norm", "gradient_checkpointing", "gradient_checkpointing_interval",
        "gradient_checkpointing_segment_stride", "gradient_checkpointing_backend",
        "gradient_checkpointing_memory_budget", "flow_schedule_shift", "instance_data_dir", "output_dir",
        "checkpoint_step_interval", "checkpoints_total_limit", "resume_from_checkpoint", "device",
        "torch_num_threads", "report_every", "ignore_unsupported_options"}) {
    EXPECT_NE(find_option(n), nullptr) << n;
  }
}

TEST(OptionsRegistry, DefaultsComeFromTheStruct) {
  // SimpleTuner's defaults, checked against its field registry by hand (not read from our table).
  EXPECT_EQ(spec("lora_rank").default_value, "16");
  EXPECT_EQ(spec("learning_rate").default_value, "4e-07");
  EXPECT_EQ(spec("optimizer").default_value, "adamw_bf16");
  EXPECT_EQ(spec("model_type").default_value, "full");
  EXPECT_EQ(spec("grad_clip_method").default_value, "value");
  EXPECT_EQ(spec("num_train_epochs").default_value, "1");
  EXPECT_EQ(spec("lr_end").default_value, "4e-07");
  EXPECT_EQ(spec("lr_power").default_value, "0.8");
  EXPECT_EQ(spec("checkpoint_step_interval").default_value, "500");
  EXPECT_EQ(spec("max_grad_norm").default_value, "2.0");
  EXPECT_EQ(spec("flow_schedule_shift").default_value, "3.0");
  EXPECT_EQ(spec("gradient_checkpointing").default_value, "true");
  EXPECT_EQ(spec("gradient_checkpointing_backend").default_value, "torch");
  EXPECT_EQ(spec("lr_scheduler").default_value, "constant_with_warmup");
  EXPECT_EQ(spec("flux_lora_target").default_value, "all");
  EXPECT_EQ(spec("resume_from_checkpoint").default_value, "latest");
  EXPECT_FALSE(spec("gradient_checkpointing_interval").default_value.has_value());
  EXPECT_FALSE(spec("seed").default_value.has_value());
}

// The checkpointing options' text is remat's own; it must still cover what SimpleTuner's field
// registry says: chunk size and spacing, labelled backends, and its dependency actions.
TEST(OptionsRegistry, CheckpointingTextCoversSimpleTuner) {
  const auto& interval = spec("gradient_checkpointing_interval");
  EXPECT_NE(interval.help.find("Chunk size"), std::string::npos) << interval.help;
  EXPECT_NE(interval.help.find("blank"), std::string::npos);
  EXPECT_NE(interval.tooltip.find("contiguous chunks"), std::string::npos) << interval.tooltip;
  EXPECT_NE(interval.tooltip.find("spacing"), std::string::npos);
  EXPECT_NE(interval.tooltip.find("N-th block"), std::string::npos);
  const auto& stride = spec("gradient_checkpointing_segment_stride");
  EXPECT_NE(stride.help.find("Spacing"), std::string::npos) << stride.help;
  ASSERT_TRUE(interval.minimum.has_value());
  EXPECT_EQ(*interval.minimum, 1.0);
  ASSERT_EQ(interval.depends_on.size(), 1u);
  EXPECT_EQ(interval.depends_on[0].option, "gradient_checkpointing");
  EXPECT_EQ(interval.depends_on[0].equals, "true");
  EXPECT_EQ(interval.depends_on[0].action, "enable");
  EXPECT_EQ(stride.depends_on[0].action, "enable");
  const auto& backend = spec("gradient_checkpointing_backend");
  EXPECT_EQ(backend.depends_on[0].action, "show");
  for (const auto& c : backend.choices) EXPECT_TRUE(backend.choice_labels.count(c)) << c;
  EXPECT_EQ(backend.choice_labels.at("torch"), "Recompute whole blocks (PyTorch)");
  EXPECT_NE(backend.choice_labels.at("unsloth-ffn").find("feed-forward"), std::string::npos);
  EXPECT_TRUE(interval.checkpointing);
  EXPECT_EQ(interval.doc_anchor(), "docs/OPTIONS.md#--gradient_checkpointing_interval");
}

TEST(OptionsRegistry, CheckpointingGroupIsExactlyItsEightOptions) {
  std::set<std::string> group;
  for (const auto& s : option_specs()) {
    if (s.checkpointing) group.insert(s.name);
  }
  EXPECT_EQ(group, (std::set<std::string>{"gradient_checkpointing", "gradient_checkpointing_interval",
                                           "gradient_checkpointing_segment_stride",
                                           "gradient_checkpointing_backend",
                                           "gradient_checkpointing_memory_budget",
                                           "gradient_checkpointing_offload_attention",
                                           "gradient_checkpointing_offload_pin_memory_max_buckets",
                                           "gradient_checkpointing_offload_prefetch"}));
}

TEST(OptionValue, TypesParse) {
  EXPECT_EQ(std::get<bool>(parse_option_value(spec("gradient_checkpointing"), "FALSE")), false);
  EXPECT_EQ(std::get<bool>(parse_option_value(spec("gradient_checkpointing"), "yes")), true);
  EXPECT_EQ(std::get<int64_t>(parse_option_value(spec("lora_rank"), "64")), 64);
  EXPECT_DOUBLE_EQ(std::get<double>(parse_option_value(spec("learning_rate"), "1e-4")), 1e-4);
  EXPECT_EQ(std::get<std::string>(parse_option_value(spec("model_family"), "mageflow")), "mageflow");
  EXPECT_EQ(std::get<int64_t>(parse_option_value(spec("gradient_checkpointing_memory_budget"), "2GiB")),
            int64_t{2} << 30);
  EXPECT_EQ(std::get<std::string>(parse_option_value(spec("gradient_checkpointing_interval"), "AUTO")), "auto");
  EXPECT_TRUE(std::holds_alternative<std::monostate>(
      parse_option_value(spec("gradient_checkpointing_interval"), std::string(""))));
  EXPECT_TRUE(std::holds_alternative<std::monostate>(parse_option_value(spec("seed"), "None")));
  EXPECT_TRUE(std::holds_alternative<std::monostate>(parse_option_value(spec("seed"), std::nullopt)));
}

TEST(OptionValue, TypeErrorsNameOptionValueAndWhatIsValid) {
  expect_rejected("lora_rank", "sixteen", {"[train] lora_rank must be an integer in [1, 4096]", "got 'sixteen'"});
  expect_rejected("lora_rank", "16.5", {"lora_rank must be an integer", "got '16.5'"});
  expect_rejected("learning_rate", "fast", {"learning_rate must be a number in [0, 1]", "got 'fast'"});
  expect_rejected("learning_rate", "nan", {"learning_rate must be a number", "got 'nan'"});
  expect_rejected("gradient_checkpointing", "maybe", {"gradient_checkpointing must be true or false", "'maybe'"});
  expect_rejected("seed", "1.5", {"seed must be an integer", "or none to leave unset", "got '1.5'"});
  expect_rejected("lora_rank", "1e-3", {"lora_rank must be an integer", "got '1e-3'"});
}

// Note [Option bounds]: every integer option has an upper bound, named in the message and the
// docs. Before them `--num_train_epochs=9223372036854775807` overflowed the step count (0 steps,
// untrained weights written, exit 0), and `--num_threads 100000` hung.
TEST(OptionValue, EveryIntegerOptionHasAnUpperBound) {
  for (const auto& s : option_specs()) {
    if (s.type != OptionType::Int) continue;
    EXPECT_TRUE(s.minimum.has_value() && s.maximum.has_value()) << s.name;
    EXPECT_NE(s.signature().find(" in ["), std::string::npos) << s.name << ": " << s.signature();
  }
  expect_rejected("num_train_epochs", "9223372036854775807",
                  {"num_train_epochs must be an integer in [0, 1000000], got '9223372036854775807'"});
  expect_rejected("max_train_steps", "1000000001", {"max_train_steps must be an integer in [0, 1000000000]"});
  expect_rejected("seed", "99999999999999999999", {"seed must be an integer in [0, 4294967295]"});
  expect_rejected("seed", "4294967296", {"got '4294967296'"});
  expect_rejected("seed", "-1", {"got '-1'"});
  expect_rejected("torch_num_threads", "100000", {"torch_num_threads must be an integer in [0, 1024], got '100000'"});
  expect_rejected("train_batch_size", "65537", {"train_batch_size must be an integer in [1, 65536]"});
  EXPECT_EQ(std::get<int64_t>(parse_option_value(spec("seed"), "4294967295")), 4294967295LL);
}

TEST(OptionValue, MinimumAndMaximum) {
  expect_rejected("lora_rank", "0", {"lora_rank must be an integer in [1, 4096], got '0'"});
  expect_rejected("learning_rate", "2", {"learning_rate must be a number in [0, 1], got '2'"});
  expect_rejected("learning_rate", "-1e-4", {"got '-1e-4'"});
  expect_rejected("optimizer_beta1", "1.5", {"optimizer_beta1 must be a number in [0, 1]", "got '1.5'"});
  expect_rejected("flow_sigmoid_scale", "0", {"flow_sigmoid_scale must be a number > 0, got '0'"});
  expect_rejected("gradient_checkpointing_interval", "0",
                  {"gradient_checkpointing_interval must be an integer in [1, 1024] or auto", "got '0'"});
  expect_rejected("gradient_checkpointing_interval", "-2", {"got '-2'"});
  expect_rejected("gradient_checkpointing_memory_budget", "0",
                  {"gradient_checkpointing_memory_budget must be a byte size", "at least 1 bytes", "got '0'"});
  // Edge values are inclusive.
  EXPECT_EQ(std::get<int64_t>(parse_option_value(spec("gradient_checkpointing_interval"), "1")), 1);
  EXPECT_DOUBLE_EQ(std::get<double>(parse_option_value(spec("learning_rate"), "1")), 1.0);
  EXPECT_DOUBLE_EQ(std::get<double>(parse_option_value(spec("learning_rate"), "0")), 0.0);
}

TEST(OptionValue, ChoicesSuggestTheClosest) {
  expect_rejected("model_family", "flx", {"model_family must be one of flux, mageflow", "got 'flx'",
                                          "did you mean 'flux'?"});
  expect_rejected("gradient_checkpointing_backend", "unsloth_ffn",
                  {"one of torch, unsloth, torch-ffn, unsloth-ffn", "did you mean 'unsloth-ffn'?"});
  expect_rejected("lr_scheduler", "cosine_annealing",
                  {"constant, constant_with_warmup, linear, polynomial, cosine, sine, cosine_with_restarts"});
  // Not nullable: "none" is not a way to unset a choice.
  expect_rejected("model_type", "none", {"model_type must be one of full, lora"});
  // A suggestion only for a near miss.
  expect_rejected("optimizer", "prodigy", {"optimizer must be one of adamw_bf16, torch-adamw, optimi-lion",
                                           "lion is read as optimi-lion", "got 'prodigy'"});
  try {
    parse_option_value(spec("optimizer"), std::string("prodigy"));
  } catch (const ValidationError& e) {
    EXPECT_EQ(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
  }
}

TEST(OptionLookup, AliasesDashesAndSuggestions) {
  EXPECT_EQ(find_option("--lora_rank"), &spec("lora_rank"));
  EXPECT_EQ(find_option("checkpointing_steps"), &spec("checkpoint_step_interval"));
  EXPECT_EQ(find_option("num_threads"), &spec("torch_num_threads"));
  EXPECT_EQ(find_option("lora_rnk"), nullptr);
  EXPECT_EQ(closest_option("lora_rnk"), "lora_rank");
  EXPECT_EQ(closest_option("--gradient_checkpointing_intervall"), "gradient_checkpointing_interval");
  EXPECT_EQ(closest_option("checkpointing_stepz"), "checkpoint_step_interval");
}

// "Did you mean" only for a small edit distance, over remat's and SimpleTuner's names. The
// misleading hints of issue 10 are gone: those keys are SimpleTuner's, and far from any other.
TEST(OptionLookup, SuggestionsOnlyForNearMisses) {
  EXPECT_EQ(suggest_option("lora_rnk"), "lora_rank");
  EXPECT_EQ(suggest_option("--gradient_checkpointing_intervl"), "gradient_checkpointing_interval");
  EXPECT_EQ(suggest_option("data_backend_confg"), "data_backend_config");  // SimpleTuner's
  EXPECT_EQ(suggest_option("use_emma"), "use_ema");
  EXPECT_EQ(suggest_option("validation_stepz"), "validation_steps");
  EXPECT_EQ(suggest_option("flx"), std::nullopt);  // three letters: one edit at most ("flux" is no option)
  EXPECT_EQ(suggest_option("completely_unrelated_key"), std::nullopt);
  EXPECT_EQ(suggest_option("foo"), std::nullopt);
  EXPECT_EQ(unknown_option_message("foo", ""), "[train] unknown option 'foo'");
}

TEST(OptionValue, NullMeansTheDefaultAndIntegralFloatsAreIntegers) {
  EXPECT_EQ(std::get<int64_t>(parse_option_value(spec("lora_rank"), std::nullopt)), 16);
  EXPECT_EQ(std::get<int64_t>(parse_option_value(spec("lora_rank"), std::string(""))), 16);
  EXPECT_EQ(std::get<std::string>(parse_option_value(spec("lr_scheduler"), std::nullopt)), "constant_with_warmup");
  EXPECT_EQ(std::get<bool>(parse_option_value(spec("gradient_checkpointing"), std::nullopt)), true);
  EXPECT_EQ(std::get<std::string>(parse_option_value(spec("output_dir"), std::string(""))), "remat-results");
  EXPECT_TRUE(std::holds_alternative<std::monostate>(parse_option_value(spec("seed"), std::nullopt)));
  EXPECT_TRUE(std::holds_alternative<std::monostate>(
      parse_option_value(spec("gradient_checkpointing_interval"), std::nullopt)));
  EXPECT_EQ(std::get<int64_t>(parse_option_value(spec("lora_rank"), std::string("16.0"))), 16);
  EXPECT_EQ(std::get<int64_t>(parse_option_value(spec("seed"), std::string("42.0"))), 42);
  EXPECT_EQ(std::get<int64_t>(parse_option_value(spec("max_train_steps"), std::string("1e3"))), 1000);
  EXPECT_EQ(std::get<int64_t>(parse_option_value(spec("gradient_checkpointing_interval"), std::string("2.0"))), 2);
  expect_rejected("lora_rank", "16.5", {"lora_rank must be an integer in [1, 4096]", "got '16.5'"});
  expect_rejected("seed", "42.25", {"seed must be an integer", "got '42.25'"});
  expect_rejected("lora_rank", "0.0", {"lora_rank must be an integer in [1, 4096]", "got '0.0'"});
}

TEST(OptionValue, ValueAliases) {
  EXPECT_EQ(std::get<std::string>(parse_option_value(spec("lr_scheduler"), std::string("cosine_with_warmup"))), "cosine");
  EXPECT_EQ(std::get<std::string>(parse_option_value(spec("optimizer"), std::string("lion"))), "optimi-lion");
  EXPECT_EQ(std::get<std::string>(parse_option_value(spec("optimizer"), std::string("adamw"))), "torch-adamw");
  EXPECT_EQ(std::get<std::string>(parse_option_value(spec("model_flavour"), std::string("flux-dev"))), "dev");
  EXPECT_EQ(std::get<std::string>(parse_option_value(spec("model_flavour"), std::string("mageflow-4b"))), "base");
  EXPECT_EQ(std::get<std::string>(parse_option_value(spec("flux_lora_target"), std::string("mmdit"))), "default");
}

TEST(HelpText, ListsEveryOptionWithTypeAndDefault) {
  const std::string help = train_help_text();
  for (const auto& s : option_specs()) {
    const std::string flag = "--" + s.name + " <";
    const size_t at = help.find(flag);
    ASSERT_NE(at, std::string::npos) << s.name;
    const std::string line = help.substr(at, help.find('\n', at) - at);
    EXPECT_NE(line.find(option_type_name(s.type)), std::string::npos) << line;
    const std::string def = !s.default_note.empty() ? s.default_note : s.default_value.value_or("unset");
    EXPECT_NE(line.find("default " + def), std::string::npos) << line;
    EXPECT_NE(help.find(s.help), std::string::npos) << s.name;
  }
  for (const auto& section : option_sections()) EXPECT_NE(help.find("\n" + section + ":\n"), std::string::npos);
  EXPECT_NE(help.find("--lora_rank <int in [1, 4096], default 16>"), std::string::npos) << help;
  EXPECT_NE(help.find("--gradient_checkpointing_interval <int in [1, 1024] | auto, default unset>"), std::string::npos);
  EXPECT_NE(help.find("config.toml or config.env"), std::string::npos);
}

TEST(JsonExport, IsADraft202012SchemaWithUiMetadata) {
  const auto doc = nlohmann::json::parse(options_json());
  EXPECT_EQ(doc["$schema"], "https://json-schema.org/draft/2020-12/schema");
  EXPECT_EQ(doc["additionalProperties"], false);
  EXPECT_EQ(doc["$defs"].size(), option_specs().size());
  // Every option under its name and with "--"; aliases too.
  for (const auto& s : option_specs()) {
    EXPECT_EQ(doc["properties"][s.name]["$ref"], "#/$defs/" + s.name);
    EXPECT_EQ(doc["properties"]["--" + s.name]["$ref"], "#/$defs/" + s.name);
    for (const auto& a : s.aliases) EXPECT_EQ(doc["properties"][a]["$ref"], "#/$defs/" + s.name);
  }
  const auto& p = doc["$defs"]["gradient_checkpointing_interval"];
  EXPECT_EQ(p["description"], spec("gradient_checkpointing_interval").help);
  ASSERT_EQ(p["oneOf"].size(), 4u);  // integer >= 1 | "auto" | a numeric string | null
  EXPECT_EQ(p["oneOf"][0]["type"], "integer");
  EXPECT_EQ(p["oneOf"][0]["minimum"], 1);
  EXPECT_EQ(p["oneOf"][1]["const"], "auto");
  EXPECT_EQ(p["oneOf"][3]["type"], "null");
  EXPECT_TRUE(p["default"].is_null());
  const auto& ui = p["x-remat"];
  EXPECT_EQ(ui["tooltip"], spec("gradient_checkpointing_interval").tooltip);
  EXPECT_EQ(ui["section"], "Gradient checkpointing");
  EXPECT_EQ(ui["order"], spec("gradient_checkpointing_interval").order);
  ASSERT_EQ(ui["dependsOn"].size(), 1u);
  EXPECT_EQ(ui["dependsOn"][0]["option"], "gradient_checkpointing");
  EXPECT_EQ(ui["dependsOn"][0]["equals"], true);
  EXPECT_EQ(ui["dependsOn"][0]["action"], "enable");
  EXPECT_EQ(ui["docs"], "docs/OPTIONS.md#--gradient_checkpointing_interval");
  EXPECT_EQ(ui["checkpointing"], true);

  const auto& backend = doc["$defs"]["gradient_checkpointing_backend"];
  EXPECT_EQ(backend["type"], nlohmann::json::array({"string", "null"}));
  EXPECT_EQ(backend["enum"], nlohmann::json::array({"torch", "unsloth", "torch-ffn", "unsloth-ffn", "", nullptr}));
  EXPECT_EQ(backend["default"], "torch");
  EXPECT_EQ(backend["x-remat"]["choiceLabels"]["torch-ffn"], "Recompute only the feed-forward part (PyTorch)");
  EXPECT_EQ(backend["x-remat"]["dependsOn"][0]["action"], "show");
  EXPECT_EQ(doc["$defs"]["lora_rank"]["default"], 16);
  EXPECT_EQ(doc["$defs"]["lora_rank"]["type"], nlohmann::json::array({"integer", "string", "null"}));
  EXPECT_EQ(doc["$defs"]["seed"]["x-remat"]["envName"], "TRAINING_SEED");
  EXPECT_EQ(doc["$defs"]["learning_rate"]["default"], 4e-7);
  EXPECT_EQ(doc["$defs"]["gradient_checkpointing"]["default"], true);
  EXPECT_EQ(doc["$defs"]["flow_sigmoid_scale"]["exclusiveMinimum"], 0);
  // SimpleTuner's other names are accepted through one pattern; remat's own are not in it.
  ASSERT_EQ(doc["patternProperties"].size(), 1u);
  const std::string pattern = doc["patternProperties"].begin().key();
  EXPECT_NE(pattern.find("|report_to|"), std::string::npos);
  EXPECT_EQ(pattern.find("|lora_rank|"), std::string::npos);
  EXPECT_EQ(doc["x-remat"]["simpletunerOptions"]["crepa_enabled"]["changesTraining"], true);
  EXPECT_EQ(doc["x-remat"]["simpletunerOptions"]["report_to"]["group"], "tracking");
}

}  // namespace options_test
}  // namespace
}  // namespace remat::train
