// `remat launch`'s flags: torchrun's names, spellings and defaults; every bad value refused with a
// message naming the flag, the value and what is valid.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include "launch/launch_options.h"
#include "launch/worker_environment.h"

namespace remat::cli::launch {
namespace {
namespace launch_options_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_launch_arguments(args);
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

TEST(LaunchOptions, DefaultsAreTorchrunsAndTheCommandFollowsTheSeparator) {
  const LaunchOptions options = parse_launch_arguments({"--nproc_per_node", "2", "--", "train", "--lora_rank", "4"});
  EXPECT_EQ(options.nproc_per_node, 2);
  EXPECT_EQ(options.nnodes, 1);
  EXPECT_EQ(options.node_rank, 0);
  EXPECT_EQ(options.master_addr, "127.0.0.1");
  EXPECT_EQ(options.master_port, 29500);
  EXPECT_EQ(options.command, (std::vector<std::string>{"train", "--lora_rank", "4"}));
  EXPECT_FALSE(options.help);
}

TEST(LaunchOptions, DashSpellingsEqualsFormsAndCommandWithoutSeparator) {
  const LaunchOptions options = parse_launch_arguments(
      {"--nproc-per-node=3", "--nnodes", "4", "--node-rank=2", "--master-addr", "10.1.2.3",
       "--master_port=1234", "train", "--help"});
  EXPECT_EQ(options.nproc_per_node, 3);
  EXPECT_EQ(options.nnodes, 4);
  EXPECT_EQ(options.node_rank, 2);
  EXPECT_EQ(options.master_addr, "10.1.2.3");
  EXPECT_EQ(options.master_port, 1234);
  // The command's own --help belongs to it, not to the launcher.
  EXPECT_EQ(options.command, (std::vector<std::string>{"train", "--help"}));
  EXPECT_FALSE(options.help);
  EXPECT_TRUE(parse_launch_arguments({"--help"}).help);
}

TEST(LaunchOptions, BadValuesNameTheFlagTheValueAndWhatIsValid) {
  EXPECT_EQ(error_of({"--nproc_per_node", "0", "--", "train"}),
            "[launch] --nproc_per_node must be an integer in [1, 1024] (workers on this node), got '0'");
  EXPECT_NE(error_of({"--nproc_per_node", "two", "--", "train"}).find("got 'two'"), std::string::npos);
  EXPECT_NE(error_of({"--nproc_per_node", "2x", "--", "train"}).find("got '2x'"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "1:4", "--", "train"}).find("elastic ranges such as 1:4 are not supported"),
            std::string::npos);
  EXPECT_EQ(error_of({"--nnodes", "2", "--node_rank", "2", "--", "train"}),
            "[launch] --node_rank must be an integer in [0, 1] (below --nnodes 2), got '2'");
  // --node_rank is checked against --nnodes wherever the two appear.
  EXPECT_NE(error_of({"--node_rank", "1", "--", "train"}).find("in [0, 0]"), std::string::npos);
  EXPECT_EQ(parse_launch_arguments({"--node_rank", "1", "--nnodes", "2", "--", "train"}).node_rank, 1);
  EXPECT_NE(error_of({"--node_rank=", "--", "train"}).find("got ''"), std::string::npos);
  EXPECT_EQ(error_of({"--master_port", "70000", "--", "train"}),
            "[launch] --master_port must be a port in [1, 65535], got '70000'");
  EXPECT_NE(error_of({"--master_port", "0", "--", "train"}).find("got '0'"), std::string::npos);
  EXPECT_NE(error_of({"--master_addr=", "--", "train"}).find("--master_addr must be"), std::string::npos);
  EXPECT_NE(error_of({"--nproc", "2", "--", "train"}).find("unknown option '--nproc'"), std::string::npos);
  EXPECT_EQ(error_of({"--nnodes"}), "[launch] --nnodes needs a value");
  EXPECT_NE(error_of({"--nproc_per_node", "2"}).find("a command to run is required after --"), std::string::npos);
  EXPECT_NE(error_of({"--nproc_per_node", "2", "--"}).find("a command to run is required"), std::string::npos);
}

// torchrun's contract, written out from its documentation for node 1 of 2 with 3 workers each.
TEST(WorkerEnvironment, TorchrunContractForEveryLocalRank) {
  LaunchOptions options;
  options.nproc_per_node = 3;
  options.nnodes = 2;
  options.node_rank = 1;
  options.master_addr = "node0";
  options.master_port = 4242;
  for (int local = 0; local < 3; ++local) {
    const auto variables = worker_variables(options, local);
    const std::vector<std::pair<std::string, std::string>> expected = {
        {"RANK", std::to_string(3 + local)}, {"WORLD_SIZE", "6"},   {"LOCAL_RANK", std::to_string(local)},
        {"LOCAL_WORLD_SIZE", "3"},           {"GROUP_RANK", "1"},   {"MASTER_ADDR", "node0"},
        {"MASTER_PORT", "4242"}};
    EXPECT_EQ(variables, expected) << "local rank " << local;
  }
}

TEST(WorkerEnvironment, ReplacesInheritedVariablesAndKeepsTheRest) {
  const auto env = with_variables({"PATH=/bin", "RANK=7", "RANKS=x", "HOME=/root"}, {{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(env, (std::vector<std::string>{"PATH=/bin", "RANKS=x", "HOME=/root", "RANK=1", "WORLD_SIZE=2"}));
}

// torchrun: "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default"
// when nproc_per_node > 1 and the variable is unset; a user's own value always wins.
TEST(WorkerEnvironment, OneThreadPerWorkerUnlessTheUserSetIt) {
  const auto one = thread_default({"PATH=/bin"}, 2);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(*one, (std::pair<std::string, std::string>{"OMP_NUM_THREADS", "1"}));
  EXPECT_FALSE(thread_default({"PATH=/bin", "OMP_NUM_THREADS=4"}, 2).has_value());
  EXPECT_FALSE(thread_default({"PATH=/bin"}, 1).has_value());
  EXPECT_TRUE(thread_default({"OMP_NUM_THREADS_X=4"}, 8).has_value());
}

}  // namespace launch_options_test
}  // namespace
}  // namespace remat::cli::launch
