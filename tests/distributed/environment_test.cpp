// torchrun's environment contract and the backend choice (remat/distributed/*.h).
#include <map>

#include <gtest/gtest.h>

#include "remat/distributed/environment.h"
#include "remat/distributed/process_group.h"
#include "value_error.h"

namespace remat::distributed {
namespace {
namespace environment_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;

::testing::AssertionResult contains(const std::string& message, const std::string& part) {
  if (message.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << message << "' does not contain '" << part << "'";
}

EnvironmentReader reader(std::map<std::string, std::string> values) {
  return [values](const std::string& name) -> std::optional<std::string> {
    const auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

TEST(LaunchEnvironment, NoWorldSizeIsOneProcess) {
  const auto env = read_launch_environment(reader({{"RANK", "3"}}));
  EXPECT_FALSE(env.distributed());
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.timeout.count(), kDefaultProcessGroupTimeoutSeconds);
}

TEST(LaunchEnvironment, ReadsTorchrunsVariables) {
  const auto env = read_launch_environment(reader({{"RANK", "5"},
                                                   {"WORLD_SIZE", "8"},
                                                   {"LOCAL_RANK", "1"},
                                                   {"LOCAL_WORLD_SIZE", "4"},
                                                   {"MASTER_ADDR", "node0"},
                                                   {"MASTER_PORT", "29400"},
                                                   {"SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS", "90"}}));
  EXPECT_TRUE(env.distributed());
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 29400);
  EXPECT_EQ(env.timeout.count(), 90);
  EXPECT_EQ(env.describe(), "rank 5 of 8");
}

TEST(LaunchEnvironment, LocalVariablesDefaultToOneMachine) {
  const auto env = read_launch_environment(
      reader({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
}

TEST(LaunchEnvironment, BadValuesNameTheVariableAndTheRange) {
  const std::map<std::string, std::string> good{
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  const auto with = [&](const std::string& name, const std::string& value) {
    auto values = good;
    values[name] = value;
    return reader(values);
  };
  EXPECT_TRUE(contains(error_of([&] { read_launch_environment(with("RANK", "2")); }), "RANK='2' must be an integer in [0, 1]"));
  EXPECT_TRUE(contains(error_of([&] { read_launch_environment(with("RANK", "-1")); }), "RANK='-1'"));
  EXPECT_TRUE(contains(error_of([&] { read_launch_environment(with("WORLD_SIZE", "two")); }), "WORLD_SIZE='two'"));
  EXPECT_TRUE(contains(error_of([&] { read_launch_environment(with("WORLD_SIZE", "0")); }), "WORLD_SIZE='0'"));
  EXPECT_TRUE(contains(error_of([&] { read_launch_environment(with("MASTER_PORT", "70000")); }), "MASTER_PORT='70000' must be an integer in [1, 65535]"));
  EXPECT_TRUE(contains(error_of([&] { read_launch_environment(with("MASTER_PORT", "12ab")); }), "MASTER_PORT='12ab'"));
  EXPECT_TRUE(contains(error_of([&] { read_launch_environment(with("MASTER_ADDR", "")); }), "MASTER_ADDR is empty"));
  EXPECT_TRUE(contains(error_of([&] { read_launch_environment(with("LOCAL_RANK", "2")); }), "LOCAL_RANK='2'"));
  EXPECT_TRUE(contains(error_of([&] { read_launch_environment(with("SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS", "0")); }),
                       "SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS='0'"));
  auto missing = good;
  missing.erase("MASTER_PORT");
  EXPECT_TRUE(contains(error_of([&] { read_launch_environment(reader(missing)); }), "MASTER_PORT is not set"));
  auto several_machines = good;
  several_machines["LOCAL_WORLD_SIZE"] = "1";
  EXPECT_TRUE(contains(error_of([&] { read_launch_environment(reader(several_machines)); }), "LOCAL_RANK must be set"));
}

TEST(Backend, AutomaticChoiceAndRefusals) {
  EXPECT_EQ(choose_backend("auto", c10::Device(c10::kCPU)), Backend::gloo);
  EXPECT_EQ(choose_backend("", c10::Device(c10::kCPU)), Backend::gloo);
  EXPECT_EQ(choose_backend("gloo", c10::Device(c10::kCPU)), Backend::gloo);
  EXPECT_TRUE(contains(error_of([&] { choose_backend("mpi", c10::Device(c10::kCPU)); }), "'mpi' is not a backend; valid: auto"));
  EXPECT_TRUE(contains(error_of([&] { choose_backend("nccl", c10::Device(c10::kCPU)); }), "NCCL backend needs a CUDA device"));
}

}  // namespace environment_test
}  // namespace
}  // namespace remat::distributed
