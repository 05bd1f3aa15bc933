// The gradient-checkpointing safety check, one test per rule of safety_check.h, and the plan that
// leaves out what its warnings say is ignored.
#include <gtest/gtest.h>

#include <map>

#include "remat/layout.h"
#include "remat/train/options/options.h"
#include "remat/train/options/safety_check.h"

namespace remat::train {
namespace {
namespace safety_check_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

// A family that supports nothing, and one with chunks but without stride or ffn scope, so the
// drop/error rows can be exercised through the family table.
const CheckpointingSupport kFamilies{
    {"flux", {true, true, true, {}, true, {}}},
    {"plain", {false, false, false, {}, false, {}}},
    {"chunky", {true, false, false, {}, false, {}}},
};

TrainConfig config_for(const std::string& family) {
  TrainConfig c;
  c.model_family = family;
  c.device = "cuda";
  return c;
}

bool contains(const std::vector<std::string>& warnings, const std::string& fragment) {
  for (const auto& w : warnings) {
    if (w.find(fragment) != std::string::npos) return true;
  }
  return false;
}

// Every option of `c` as the registry writes it.
std::map<std::string, std::optional<std::string>> rendered(const TrainConfig& c) {
  std::map<std::string, std::optional<std::string>> out;
  for (const auto& spec : option_specs()) out[spec.name] = spec.render(c);
  return out;
}

// The warnings of the check, which must leave `c` as it was.
std::vector<std::string> checked(const TrainConfig& c, const CheckpointingSupport& families = kFamilies) {
  const auto before = rendered(c);
  auto warnings = safety_check(c, families);
  EXPECT_EQ(rendered(c), before) << "the safety check changed the config";
  return warnings;
}

void expect_error(const TrainConfig& c, const std::string& option, const std::vector<std::string>& fragments,
                  const CheckpointingSupport& families = kFamilies) {
  try {
    safety_check(c, families);
    ADD_FAILURE() << "no error for " << option;
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.option(), option);
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

// The first stack's layout of `c`'s plan on `family`, for a stack of 12 blocks.
Layout plan_layout(const TrainConfig& c, const std::string& family) {
  const CheckpointingCapabilities none;
  const CheckpointingCapabilities* caps = &none;
  for (const auto& [name, capabilities] : kFamilies) {
    if (name == family) caps = &capabilities;
  }
  return checkpoint_plan_for(c, *caps).layout_for(0, 12);
}

Layout chunks(int64_t interval, std::optional<int64_t> stride = std::nullopt) {
  return layout_from_interval(12, interval, stride, Backend::Recompute);
}

TEST(SafetyCheck, SupportTableHasFluxAndMageFlowWithEveryFeature) {
  const auto table = checkpointing_support();
  ASSERT_EQ(table.size(), 2u);
  for (const auto& [family, capabilities] : table) {
    EXPECT_TRUE(family == "flux" || family == "mageflow") << family;
    EXPECT_TRUE(capabilities.interval && capabilities.segment_stride && capabilities.ffn_scope) << family;
    EXPECT_FALSE(capabilities.stacks.empty()) << family;
  }
}

TEST(SafetyCheck, DefaultsPassSilently) {
  TrainConfig c = config_for("flux");
  EXPECT_TRUE(checked(c, checkpointing_support()).empty());
  TrainConfig m = config_for("mageflow");
  m.gradient_checkpointing_interval = CheckpointInterval::blocks(3);
  m.gradient_checkpointing_segment_stride = 4;
  m.gradient_checkpointing_backend = "unsloth-ffn";
  EXPECT_TRUE(checked(m, checkpointing_support()).empty());
}

// The interval is one value, read by the registry: a count or auto; 1 and blank are per block.
TEST(CheckpointInterval, ParsesCountsAutoAndBlank) {
  EXPECT_TRUE(CheckpointInterval::parse(std::string("auto")).is_auto());
  EXPECT_TRUE(CheckpointInterval::parse(std::string("AUTO")).is_auto());
  EXPECT_EQ(CheckpointInterval::parse(std::string("auto")).text(), "auto");
  EXPECT_EQ(CheckpointInterval::parse(std::string("4")).chunk(), 4);
  EXPECT_EQ(CheckpointInterval::parse(std::string("4")).text(), "4");
  EXPECT_EQ(CheckpointInterval::parse(std::string("2.0")), CheckpointInterval::blocks(2));
  for (const std::optional<std::string>& blank : {std::optional<std::string>(), std::optional<std::string>(""),
                                                 std::optional<std::string>("none"), std::optional<std::string>("1")}) {
    const CheckpointInterval i = CheckpointInterval::parse(blank);
    EXPECT_TRUE(i.per_block()) << blank.value_or("null");
    EXPECT_FALSE(i.chunk().has_value());
    EXPECT_FALSE(i.text().has_value());  // written as unset, as SimpleTuner's blank
    EXPECT_EQ(i, CheckpointInterval{});
  }
  EXPECT_FALSE(CheckpointInterval::automatic().chunk().has_value());
  EXPECT_NE(CheckpointInterval::automatic(), CheckpointInterval{});
}

TEST(CheckpointInterval, RefusesWhatTheRegistryRefuses) {
  for (const std::string bad : {"0", "-2", "1025", "every", "1.5"}) {
    try {
      CheckpointInterval::parse(bad);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.option(), "gradient_checkpointing_interval");
      EXPECT_NE(std::string(e.what()).find("[train] gradient_checkpointing_interval must be an integer in [1, 1024] "
                                           "or auto, or none to leave unset, got '" + bad + "'"),
                std::string::npos)
          << e.what();
    }
  }
  // Configs built in code get the same check.
  for (int64_t bad : {0, -3, 2048}) {
    EXPECT_THROW(CheckpointInterval::blocks(bad), ValidationError) << bad;
  }
  EXPECT_EQ(CheckpointInterval::blocks(1024).chunk(), 1024);
}

// The registry row writes what it read: config files of older runs read back the same.
TEST(CheckpointInterval, RegistryRoundTrip) {
  const OptionSpec* spec = find_option("gradient_checkpointing_interval");
  ASSERT_NE(spec, nullptr);
  for (const char* text : {"auto", "2", "7"}) {
    TrainConfig c;
    spec->assign(c, parse_option_value(*spec, std::string(text)));
    EXPECT_EQ(spec->render(c), text);
    EXPECT_EQ(c.gradient_checkpointing_interval, CheckpointInterval::parse(std::string(text)));
  }
  TrainConfig one;
  spec->assign(one, parse_option_value(*spec, std::string("1")));
  EXPECT_EQ(spec->render(one), std::nullopt);
  EXPECT_EQ(spec->render(TrainConfig{}), std::nullopt);
}

TEST(SafetyCheck, IntervalOneMeansPerBlock) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_interval = CheckpointInterval::blocks(1);
  EXPECT_TRUE(checked(c).empty());
  EXPECT_EQ(plan_layout(c, "flux"), chunks(1));
  EXPECT_EQ(plan_layout(c, "flux"), plan_layout(config_for("flux"), "flux"));
}

// The plan's layouts for interval 1 / N / auto, with and without a stride, on each kind of family:
// what the safety check used to leave in the config for CheckpointPlan::simpletuner.
TEST(SafetyCheck, PlanUsesWhatTheCheckKeeps) {
  TrainConfig c = config_for("flux");
  EXPECT_EQ(plan_layout(c, "flux"), chunks(1));
  c.gradient_checkpointing_interval = CheckpointInterval::blocks(3);
  EXPECT_EQ(plan_layout(c, "flux"), chunks(3));
  EXPECT_EQ(plan_layout(c, "chunky"), chunks(3));
  EXPECT_EQ(plan_layout(c, "plain"), chunks(1));  // rule 3: no chunks on plain
  c.gradient_checkpointing_segment_stride = 5;
  EXPECT_EQ(plan_layout(c, "flux"), chunks(3, 5));
  EXPECT_EQ(plan_layout(c, "chunky"), chunks(3));  // rule 4: no stride on chunky
  EXPECT_EQ(plan_layout(c, "plain"), chunks(1));
  c.gradient_checkpointing_interval = CheckpointInterval::automatic();  // per block until planned
  EXPECT_EQ(plan_layout(c, "flux"), chunks(1));
  EXPECT_FALSE(checkpoint_plan_for(c, kFamilies[0].second).segment_stride.has_value());
  c.gradient_checkpointing_interval = CheckpointInterval::blocks(1);
  EXPECT_EQ(plan_layout(c, "flux"), chunks(1));
  EXPECT_FALSE(checkpoint_plan_for(c, kFamilies[0].second).segment_stride.has_value());

  // The registered families' plans, and who plans a layout.
  TrainConfig f = config_for("flux");
  f.gradient_checkpointing_interval = CheckpointInterval::blocks(2);
  EXPECT_EQ(f.checkpoint_plan().layout_for(0, 12), chunks(2));
  EXPECT_FALSE(f.checkpoint_layout_planned());
  f.gradient_checkpointing_interval = CheckpointInterval::automatic();
  EXPECT_TRUE(f.checkpoint_layout_planned());
  f.gradient_checkpointing = false;
  EXPECT_FALSE(f.checkpoint_layout_planned());
  EXPECT_FALSE(f.checkpoint_plan().enabled);
  TrainConfig u = config_for("unregistered");
  u.gradient_checkpointing_interval = CheckpointInterval::automatic();
  EXPECT_FALSE(u.checkpoint_layout_planned());
}

TEST(SafetyCheck, IntervalOnUnsupportedFamilyIsIgnored) {
  TrainConfig c = config_for("plain");
  c.gradient_checkpointing_interval = CheckpointInterval::blocks(2);
  const auto w = checked(c);
  EXPECT_TRUE(contains(w, "gradient_checkpointing_interval is not supported with plain models"));
  EXPECT_TRUE(contains(w, "supported: flux, chunky"));
  EXPECT_EQ(c.gradient_checkpointing_interval, CheckpointInterval::blocks(2));
  EXPECT_TRUE(interval_in_effect(c, kFamilies[1].second).per_block());

  TrainConfig a = config_for("plain");
  a.gradient_checkpointing_interval = CheckpointInterval::automatic();
  EXPECT_TRUE(contains(checked(a), "not supported with plain"));
  EXPECT_FALSE(interval_in_effect(a, kFamilies[1].second).is_auto());

  // A family missing from the table supports nothing.
  TrainConfig u = config_for("unknown");
  u.gradient_checkpointing_interval = CheckpointInterval::blocks(2);
  EXPECT_TRUE(contains(checked(u), "not supported with unknown"));
}

TEST(SafetyCheck, StrideWithoutIntervalIsIgnored) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_segment_stride = 4;
  EXPECT_TRUE(contains(checked(c), "requires gradient_checkpointing_interval greater than 1"));
  EXPECT_EQ(plan_layout(c, "flux"), chunks(1));

  // Interval 1 is per-block, so a stride next to it is ignored too (as in SimpleTuner).
  TrainConfig one = config_for("flux");
  one.gradient_checkpointing_interval = CheckpointInterval::blocks(1);
  one.gradient_checkpointing_segment_stride = 4;
  EXPECT_TRUE(contains(checked(one), "ignoring segment stride"));
  EXPECT_EQ(plan_layout(one, "flux"), chunks(1));
}

TEST(SafetyCheck, StrideBelowIntervalIsAnError) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_interval = CheckpointInterval::blocks(4);
  c.gradient_checkpointing_segment_stride = 3;
  expect_error(c, "gradient_checkpointing_segment_stride",
               {"gradient_checkpointing_segment_stride must be >= gradient_checkpointing_interval (4), got 3"});
  c.gradient_checkpointing_segment_stride = 4;  // equal is fine
  EXPECT_TRUE(checked(c).empty());
}

TEST(SafetyCheck, StrideZeroIsAnError) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_interval = CheckpointInterval::blocks(2);
  c.gradient_checkpointing_segment_stride = 0;
  expect_error(c, "gradient_checkpointing_segment_stride",
               {"gradient_checkpointing_segment_stride must be an integer in [1, 1024], got 0"});
}

TEST(SafetyCheck, StrideOnFamilyWithoutStrideIsIgnored) {
  TrainConfig c = config_for("chunky");
  c.gradient_checkpointing_interval = CheckpointInterval::blocks(2);
  c.gradient_checkpointing_segment_stride = 3;
  EXPECT_TRUE(contains(checked(c), "segment_stride is not supported with chunky"));
  EXPECT_EQ(plan_layout(c, "chunky"), chunks(2));
}

TEST(SafetyCheck, StrideWithAutoIsIgnored) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_interval = CheckpointInterval::automatic();
  c.gradient_checkpointing_segment_stride = 3;
  EXPECT_TRUE(contains(checked(c), "ignored with gradient_checkpointing_interval=auto"));
}

TEST(SafetyCheck, FfnBackendNeedsAnFfnScope) {
  for (const char* backend : {"torch-ffn", "unsloth-ffn"}) {
    TrainConfig c = config_for("chunky");
    c.gradient_checkpointing_backend = backend;
    expect_error(c, "gradient_checkpointing_backend",
                 {"gradient_checkpointing_backend must be torch or unsloth for chunky models",
                  "supported by: flux", std::string("got ") + backend});
  }
  TrainConfig ok = config_for("chunky");
  ok.gradient_checkpointing_backend = "unsloth";
  EXPECT_TRUE(checked(ok).empty());
}

TEST(SafetyCheck, UnslothOnCpuWarnsThatTensorsStay) {
  for (const std::string backend : {"unsloth", "unsloth-ffn"}) {
    TrainConfig c = config_for("flux");
    c.device = "cpu";
    c.gradient_checkpointing_backend = backend;
    const auto w = checked(c);
    EXPECT_TRUE(contains(w, "on device cpu the saved tensors stay in place")) << backend;
  }
  TrainConfig t = config_for("flux");
  t.device = "cpu";
  EXPECT_TRUE(checked(t).empty());  // torch on cpu: nothing to say
}

TEST(SafetyCheck, LayoutOptionsWithCheckpointingOffHaveNoEffect) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing = false;
  c.gradient_checkpointing_interval = CheckpointInterval::blocks(2);
  c.gradient_checkpointing_segment_stride = 3;
  c.gradient_checkpointing_backend = "torch-ffn";
  c.gradient_checkpointing_memory_budget = int64_t{1} << 30;
  const auto w = checked(c);
  EXPECT_TRUE(contains(w, "gradient_checkpointing_interval=2 has no effect because gradient_checkpointing is false"));
  EXPECT_TRUE(contains(w, "gradient_checkpointing_segment_stride=3 has no effect"));
  EXPECT_TRUE(contains(w, "gradient_checkpointing_backend=torch-ffn has no effect"));
  EXPECT_TRUE(contains(w, "gradient_checkpointing_memory_budget=1GiB has no effect"));
  EXPECT_EQ(w.size(), 4u);

  TrainConfig a = config_for("flux");
  a.gradient_checkpointing = false;
  a.gradient_checkpointing_interval = CheckpointInterval::automatic();
  EXPECT_TRUE(contains(checked(a), "gradient_checkpointing_interval=auto has no effect"));

  // Interval 1 is the default, per block: nothing to say.
  TrainConfig one = config_for("flux");
  one.gradient_checkpointing = false;
  one.gradient_checkpointing_interval = CheckpointInterval::blocks(1);
  EXPECT_TRUE(checked(one).empty());
}

TEST(SafetyCheck, BudgetWithoutAutoIsIgnored) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_interval = CheckpointInterval::blocks(2);
  c.gradient_checkpointing_memory_budget = int64_t{512} << 20;
  EXPECT_TRUE(contains(checked(c),
                       "gradient_checkpointing_memory_budget=512MiB is only used with gradient_checkpointing_interval=auto"));
  EXPECT_EQ(c.gradient_checkpointing_memory_budget, int64_t{512} << 20);
}


// Each warning names the option it is about (a UI shows it next to that field), and the
// diagnostics are the warnings safety_check returns, in the same order.
TEST(SafetyCheck, WarningsNameTheirOption) {
  TrainConfig off = config_for("flux");
  off.gradient_checkpointing = false;
  off.gradient_checkpointing_interval = CheckpointInterval::blocks(2);
  const auto diagnostics = safety_check_diagnostics(off, kFamilies);
  ASSERT_EQ(diagnostics.size(), 1u);
  EXPECT_EQ(diagnostics[0].option, "gradient_checkpointing_interval");
  EXPECT_EQ(diagnostics[0].severity, Diagnostic::Severity::Warning);
  EXPECT_EQ(safety_check(off, kFamilies), std::vector<std::string>{diagnostics[0].message});

  TrainConfig plain = config_for("plain");
  plain.gradient_checkpointing_interval = CheckpointInterval::blocks(2);
  plain.gradient_checkpointing_segment_stride = 4;
  std::vector<std::string> options;
  for (const auto& d : safety_check_diagnostics(plain, kFamilies)) options.push_back(d.option);
  EXPECT_EQ(options, (std::vector<std::string>{"gradient_checkpointing_interval", "gradient_checkpointing_segment_stride"}));

  TrainConfig offload = config_for("flux");
  offload.device = "cpu";
  offload.gradient_checkpointing_backend = "unsloth";
  const auto cpu = safety_check_diagnostics(offload, kFamilies);
  ASSERT_EQ(cpu.size(), 1u);
  EXPECT_EQ(cpu[0].option, "gradient_checkpointing_backend");
}

}  // namespace safety_check_test
}  // namespace
}  // namespace remat::train
