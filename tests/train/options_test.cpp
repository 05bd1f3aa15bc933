// The options registry: value typing and validation rules, help text and JSON export.
#include <gtest/gtest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "remat/train/options.h"

namespace remat::train {
namespace {

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
        "adam_beta1", "adam_beta2", "adam_epsilon", "adam_weight_decay", "lr_scheduler", "lr_warmup_steps",
        "train_batch_size", "gradient_accumulation_steps", "max_train_steps", "seed", "mixed_precision",
        "max_grad_norm", "gradient_checkpointing", "gradient_checkpointing_interval",
        "gradient_checkpointing_segment_stride", "gradient_checkpointing_backend",
        "gradient_checkpointing_memory_budget", "flow_schedule_shift", "instance_data_dir", "output_dir",
        "checkpointing_steps", "checkpoints_total_limit", "resume_from_checkpoint", "device", "num_threads",
        "report_every"}) {
    EXPECT_NE(find_option(n), nullptr) << n;
  }
}

TEST(OptionsRegistry, DefaultsComeFromTheStruct) {
  // SimpleTuner's defaults, checked against its field registry by hand (not read from our table).
  EXPECT_EQ(spec("lora_rank").default_value, "16");
  EXPECT_EQ(spec("learning_rate").default_value, "4e-07");
  EXPECT_EQ(spec("adam_beta2").default_value, "0.999");
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

TEST(OptionsRegistry, IntervalSpecMatchesSimpleTuner) {
  const auto& s = spec("gradient_checkpointing_interval");
  EXPECT_EQ(s.help,
            "Checkpoint contiguous chunks of N transformer blocks (leave blank for per-block checkpointing)");
  EXPECT_EQ(s.tooltip,
            "Higher values reduce recompute overhead but keep more activations in memory. Flux and MageFlow "
            "use contiguous chunked checkpointing on whole-block paths.");
  ASSERT_TRUE(s.minimum.has_value());
  EXPECT_EQ(*s.minimum, 1.0);
  ASSERT_EQ(s.depends_on.size(), 1u);
  EXPECT_EQ(s.depends_on[0].option, "gradient_checkpointing");
  EXPECT_EQ(s.depends_on[0].equals, "true");
  EXPECT_TRUE(s.checkpointing);
  EXPECT_EQ(s.doc_anchor(), "docs/OPTIONS.md#--gradient_checkpointing_interval");
}

TEST(OptionsRegistry, CheckpointingGroupIsExactlyTheFiveOptions) {
  std::set<std::string> group;
  for (const auto& s : option_specs()) {
    if (s.checkpointing) group.insert(s.name);
  }
  EXPECT_EQ(group, (std::set<std::string>{"gradient_checkpointing", "gradient_checkpointing_interval",
                                           "gradient_checkpointing_segment_stride",
                                           "gradient_checkpointing_backend",
                                           "gradient_checkpointing_memory_budget"}));
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
  expect_rejected("seed", "1.5", {"seed must be an integer", "or blank to leave unset", "got '1.5'"});
  expect_rejected("lora_rank", std::nullopt, {"lora_rank must be an integer", "got 'null'"});
  expect_rejected("output_dir", "", {"output_dir must be a path", "got ''"});
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
                  {"num_train_epochs must be an integer in [1, 1000000], got '9223372036854775807'"});
  expect_rejected("max_train_steps", "1000000001", {"max_train_steps must be an integer in [0, 1000000000]"});
  expect_rejected("seed", "99999999999999999999", {"seed must be an integer in [0, 4294967295]"});
  expect_rejected("seed", "4294967296", {"got '4294967296'"});
  expect_rejected("seed", "-1", {"got '-1'"});
  expect_rejected("num_threads", "100000", {"num_threads must be an integer in [0, 1024], got '100000'"});
  expect_rejected("train_batch_size", "65537", {"train_batch_size must be an integer in [1, 65536]"});
  EXPECT_EQ(std::get<int64_t>(parse_option_value(spec("seed"), "4294967295")), 4294967295LL);
}

TEST(OptionValue, MinimumAndMaximum) {
  expect_rejected("lora_rank", "0", {"lora_rank must be an integer in [1, 4096], got '0'"});
  expect_rejected("learning_rate", "2", {"learning_rate must be a number in [0, 1], got '2'"});
  expect_rejected("learning_rate", "-1e-4", {"got '-1e-4'"});
  expect_rejected("adam_beta1", "1.5", {"adam_beta1 must be a number in [0, 1], got '1.5'"});
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
  expect_rejected("lr_scheduler", "cosine_with_restarts", {"constant, constant_with_warmup, cosine"});
  // Not nullable: "none" is not a way to unset a choice.
  expect_rejected("model_type", "none", {"model_type must be one of full, lora"});
}

TEST(OptionLookup, AliasesDashesAndSuggestions) {
  EXPECT_EQ(find_option("--lora_rank"), &spec("lora_rank"));
  EXPECT_EQ(find_option("checkpoint_step_interval"), &spec("checkpointing_steps"));
  EXPECT_EQ(find_option("lora_rnk"), nullptr);
  EXPECT_EQ(closest_option("lora_rnk"), "lora_rank");
  EXPECT_EQ(closest_option("--gradient_checkpointing_intervall"), "gradient_checkpointing_interval");
  EXPECT_EQ(closest_option("checkpoint_step_intervl"), "checkpointing_steps");
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
}

TEST(JsonExport, IsValidJsonWithTheIntervalSchema) {
  const auto doc = nlohmann::json::parse(options_json());
  ASSERT_TRUE(doc.contains("properties"));
  EXPECT_EQ(doc["properties"].size(), option_specs().size());
  const auto& p = doc["properties"]["gradient_checkpointing_interval"];
  EXPECT_EQ(p["type"], "integer");
  EXPECT_EQ(p["description"],
            "Checkpoint contiguous chunks of N transformer blocks (leave blank for per-block checkpointing)");
  EXPECT_EQ(p["tooltip"],
            "Higher values reduce recompute overhead but keep more activations in memory. Flux and MageFlow "
            "use contiguous chunked checkpointing on whole-block paths.");
  EXPECT_EQ(p["minimum"], 1);
  EXPECT_TRUE(p["default"].is_null());
  EXPECT_EQ(p["keywords"], nlohmann::json::array({"auto"}));
  ASSERT_EQ(p["dependsOn"].size(), 1u);
  EXPECT_EQ(p["dependsOn"][0]["option"], "gradient_checkpointing");
  EXPECT_EQ(p["dependsOn"][0]["equals"], true);
  EXPECT_EQ(p["docs"], "docs/OPTIONS.md#--gradient_checkpointing_interval");
  EXPECT_EQ(p["checkpointing"], true);

  const auto& backend = doc["properties"]["gradient_checkpointing_backend"];
  EXPECT_EQ(backend["enum"], nlohmann::json::array({"torch", "unsloth", "torch-ffn", "unsloth-ffn"}));
  EXPECT_EQ(backend["default"], "torch");
  EXPECT_EQ(doc["properties"]["lora_rank"]["default"], 16);
  EXPECT_EQ(doc["properties"]["learning_rate"]["default"], 4e-7);
  EXPECT_EQ(doc["properties"]["gradient_checkpointing"]["default"], true);
  EXPECT_EQ(doc["properties"]["gradient_checkpointing_memory_budget"]["format"], "bytes");
  EXPECT_EQ(doc["properties"]["flow_sigmoid_scale"]["exclusiveMinimum"], 0);
}

}  // namespace
}  // namespace remat::train
