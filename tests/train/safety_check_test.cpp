// The gradient-checkpointing safety check, one test per rule of safety_check.h.
#include <gtest/gtest.h>

#include "remat/train/safety_check.h"

namespace remat::train {
namespace {
namespace safety_check_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

// A family that supports nothing, and one with chunks but without stride or ffn scope, so the
// drop/error rows can be exercised through the family table.
const std::vector<FamilyCheckpointing> kFamilies{
    {"flux", true, true, true},
    {"plain", false, false, false},
    {"chunky", true, false, false},
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

void expect_error(TrainConfig c, const std::string& option, const std::vector<std::string>& fragments,
                  const std::vector<FamilyCheckpointing>& families = kFamilies) {
  try {
    safety_check(c, families);
    ADD_FAILURE() << "no error for " << option;
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.option(), option);
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(SafetyCheck, SupportTableHasFluxAndMageFlowWithEveryFeature) {
  const auto& table = checkpointing_support();
  ASSERT_EQ(table.size(), 2u);
  for (const auto& f : table) {
    EXPECT_TRUE(f.family == "flux" || f.family == "mageflow") << f.family;
    EXPECT_TRUE(f.interval && f.segment_stride && f.ffn_scope) << f.family;
  }
}

TEST(SafetyCheck, DefaultsPassSilently) {
  TrainConfig c = config_for("flux");
  EXPECT_TRUE(safety_check(c).empty());
  TrainConfig m = config_for("mageflow");
  m.gradient_checkpointing_interval = 3;
  m.gradient_checkpointing_segment_stride = 4;
  m.gradient_checkpointing_backend = "unsloth-ffn";
  EXPECT_TRUE(safety_check(m).empty());
  EXPECT_EQ(m.gradient_checkpointing_interval, 3);
  EXPECT_EQ(m.gradient_checkpointing_segment_stride, 4);
}

TEST(SafetyCheck, IntervalOneMeansPerBlock) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_interval = 1;
  EXPECT_TRUE(safety_check(c, kFamilies).empty());
  EXPECT_FALSE(c.gradient_checkpointing_interval.has_value());
}

TEST(SafetyCheck, IntervalZeroOrNegativeIsAnError) {
  for (int64_t bad : {0, -3}) {
    TrainConfig c = config_for("flux");
    c.gradient_checkpointing_interval = bad;
    expect_error(c, "gradient_checkpointing_interval",
                 {"gradient_checkpointing_interval must be an integer in [1, 1024] or auto", "got " + std::to_string(bad)});
  }
}

TEST(SafetyCheck, IntervalOnUnsupportedFamilyIsDropped) {
  TrainConfig c = config_for("plain");
  c.gradient_checkpointing_interval = 2;
  const auto w = safety_check(c, kFamilies);
  EXPECT_TRUE(contains(w, "gradient_checkpointing_interval is not supported with plain models"));
  EXPECT_TRUE(contains(w, "supported: flux, chunky"));
  EXPECT_FALSE(c.gradient_checkpointing_interval.has_value());

  TrainConfig a = config_for("plain");
  a.gradient_checkpointing_interval_auto = true;
  EXPECT_TRUE(contains(safety_check(a, kFamilies), "not supported with plain"));
  EXPECT_FALSE(a.gradient_checkpointing_interval_auto);

  // A family missing from the table supports nothing.
  TrainConfig u = config_for("unknown");
  u.gradient_checkpointing_interval = 2;
  EXPECT_TRUE(contains(safety_check(u, kFamilies), "not supported with unknown"));
}

TEST(SafetyCheck, StrideWithoutIntervalIsIgnored) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_segment_stride = 4;
  EXPECT_TRUE(contains(safety_check(c, kFamilies), "requires gradient_checkpointing_interval greater than 1"));
  EXPECT_FALSE(c.gradient_checkpointing_segment_stride.has_value());

  // Interval 1 is per-block, so a stride next to it is ignored too (as in SimpleTuner).
  TrainConfig one = config_for("flux");
  one.gradient_checkpointing_interval = 1;
  one.gradient_checkpointing_segment_stride = 4;
  EXPECT_TRUE(contains(safety_check(one, kFamilies), "ignoring segment stride"));
  EXPECT_FALSE(one.gradient_checkpointing_segment_stride.has_value());
}

TEST(SafetyCheck, StrideBelowIntervalIsAnError) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_interval = 4;
  c.gradient_checkpointing_segment_stride = 3;
  expect_error(c, "gradient_checkpointing_segment_stride",
               {"gradient_checkpointing_segment_stride must be >= gradient_checkpointing_interval (4), got 3"});
  c.gradient_checkpointing_segment_stride = 4;  // equal is fine
  EXPECT_TRUE(safety_check(c, kFamilies).empty());
}

TEST(SafetyCheck, StrideZeroIsAnError) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_interval = 2;
  c.gradient_checkpointing_segment_stride = 0;
  expect_error(c, "gradient_checkpointing_segment_stride",
               {"gradient_checkpointing_segment_stride must be an integer in [1, 1024], got 0"});
}

TEST(SafetyCheck, StrideOnFamilyWithoutStrideIsDropped) {
  TrainConfig c = config_for("chunky");
  c.gradient_checkpointing_interval = 2;
  c.gradient_checkpointing_segment_stride = 3;
  EXPECT_TRUE(contains(safety_check(c, kFamilies), "segment_stride is not supported with chunky"));
  EXPECT_FALSE(c.gradient_checkpointing_segment_stride.has_value());
  EXPECT_EQ(c.gradient_checkpointing_interval, 2);
}

TEST(SafetyCheck, StrideWithAutoIsDropped) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_interval_auto = true;
  c.gradient_checkpointing_segment_stride = 3;
  EXPECT_TRUE(contains(safety_check(c, kFamilies), "ignored with gradient_checkpointing_interval=auto"));
  EXPECT_FALSE(c.gradient_checkpointing_segment_stride.has_value());
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
  EXPECT_TRUE(safety_check(ok, kFamilies).empty());
}

TEST(SafetyCheck, UnslothOnCpuWarnsThatTensorsStay) {
  for (const std::string backend : {"unsloth", "unsloth-ffn"}) {
    TrainConfig c = config_for("flux");
    c.device = "cpu";
    c.gradient_checkpointing_backend = backend;
    const auto w = safety_check(c, kFamilies);
    EXPECT_TRUE(contains(w, "on device cpu the saved tensors stay in place")) << backend;
    EXPECT_EQ(c.gradient_checkpointing_backend, backend);
  }
  TrainConfig t = config_for("flux");
  t.device = "cpu";
  EXPECT_TRUE(safety_check(t, kFamilies).empty());  // torch on cpu: nothing to say
}

TEST(SafetyCheck, LayoutOptionsWithCheckpointingOffHaveNoEffect) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing = false;
  c.gradient_checkpointing_interval = 2;
  c.gradient_checkpointing_segment_stride = 3;
  c.gradient_checkpointing_backend = "torch-ffn";
  c.gradient_checkpointing_memory_budget = int64_t{1} << 30;
  const auto w = safety_check(c, kFamilies);
  EXPECT_TRUE(contains(w, "gradient_checkpointing_interval=2 has no effect because gradient_checkpointing is false"));
  EXPECT_TRUE(contains(w, "gradient_checkpointing_segment_stride=3 has no effect"));
  EXPECT_TRUE(contains(w, "gradient_checkpointing_backend=torch-ffn has no effect"));
  EXPECT_TRUE(contains(w, "gradient_checkpointing_memory_budget=1GiB has no effect"));
  EXPECT_EQ(w.size(), 4u);

  TrainConfig a = config_for("flux");
  a.gradient_checkpointing = false;
  a.gradient_checkpointing_interval_auto = true;
  EXPECT_TRUE(contains(safety_check(a, kFamilies), "gradient_checkpointing_interval=auto has no effect"));
}

TEST(SafetyCheck, BudgetWithoutAutoIsDropped) {
  TrainConfig c = config_for("flux");
  c.gradient_checkpointing_interval = 2;
  c.gradient_checkpointing_memory_budget = int64_t{512} << 20;
  EXPECT_TRUE(contains(safety_check(c, kFamilies),
                       "gradient_checkpointing_memory_budget=512MiB is only used with gradient_checkpointing_interval=auto"));
  EXPECT_FALSE(c.gradient_checkpointing_memory_budget.has_value());
}


// Each warning names the option it is about (a UI shows it next to that field), and the
// diagnostics are the warnings safety_check returns, in the same order.
TEST(SafetyCheck, WarningsNameTheirOption) {
  TrainConfig off = config_for("flux");
  off.gradient_checkpointing = false;
  off.gradient_checkpointing_interval = 2;
  TrainConfig off_copy = off;
  const auto diagnostics = safety_check_diagnostics(off, kFamilies);
  ASSERT_EQ(diagnostics.size(), 1u);
  EXPECT_EQ(diagnostics[0].option, "gradient_checkpointing_interval");
  EXPECT_EQ(diagnostics[0].severity, Diagnostic::Severity::Warning);
  EXPECT_EQ(safety_check(off_copy, kFamilies), std::vector<std::string>{diagnostics[0].message});

  TrainConfig plain = config_for("plain");
  plain.gradient_checkpointing_interval = 2;
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
