// The launcher's process handling with /bin/sh workers: the environment each rank gets, whole
// prefixed lines, a failure stopping the others quickly, signals by name, SIGINT forwarded once.
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "launch/supervisor.h"
#include "launch/worker_environment.h"

namespace remat::cli::launch {
namespace {
namespace supervisor_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// A file the launcher writes into; read back after the run.
class Capture {
 public:
  Capture() {
    char name[] = "/tmp/launch_test_XXXXXX";
    fd_ = mkstemp(name);
    path_ = name;
  }
  ~Capture() {
    ::close(fd_);
    fs::remove(path_);
  }
  int fd() const { return fd_; }
  std::string text() const {
    std::ifstream in(path_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  int fd_ = -1;
  std::string path_;
};

struct Outcome {
  int code = -1;
  std::string out, err;
  double seconds = 0;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class Launch : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/launch_dir_XXXXXX";
    dir_ = mkdtemp(name);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Worker `local_rank` of `options`, running `script` in /bin/sh with DIR set to a scratch folder.
  WorkerSpec shell_worker(const LaunchOptions& options, int local_rank, const std::string& script) {
    WorkerSpec spec;
    spec.argv = {"/bin/sh", "-c", script};
    auto variables = worker_variables(options, local_rank);
    variables.emplace_back("DIR", dir_);
    spec.env = with_variables(current_environment(), variables);
    spec.rank = global_rank(options, local_rank);
    return spec;
  }

  Outcome run(const std::vector<WorkerSpec>& workers, milliseconds grace = milliseconds(5000)) {
    Capture out, err;
    SupervisorOptions options;
    options.stdout_fd = out.fd();
    options.stderr_fd = err.fd();
    options.stop_grace = grace;
    const auto start = std::chrono::steady_clock::now();
    Outcome result;
    result.code = run_workers(workers, options);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.out = out.text();
    result.err = err.text();
    return result;
  }

  void wait_for_files(const std::vector<std::string>& names) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (const auto& name : names) {
      while (!fs::exists(dir_ + "/" + name) && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(milliseconds(10));
      }
    }
  }

  std::string dir_;
};

LaunchOptions two_workers() {
  LaunchOptions options;
  options.nproc_per_node = 2;
  return options;
}

TEST_F(Launch, EachRankGetsTorchrunsEnvironmentAndItsPrefix) {
  LaunchOptions options;
  options.nproc_per_node = 2;
  options.nnodes = 2;
  options.node_rank = 1;
  options.master_addr = "10.9.8.7";
  options.master_port = 12345;
  const std::string script =
      "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT\"; "
      "echo \"err $LOCAL_RANK\" >&2; printf 'no newline'";
  const Outcome result = run({shell_worker(options, 0, script), shell_worker(options, 1, script)});
  EXPECT_EQ(result.code, 0) << result.err;
  // Node 1 of 2, two workers each: global ranks 2 and 3 of 4.
  std::vector<std::string> out = lines_of(result.out), err = lines_of(result.err);
  std::sort(out.begin(), out.end());
  std::sort(err.begin(), err.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[rank2]: 2 4 0 2 1 10.9.8.7 12345", "[rank2]: no newline",
                                           "[rank3]: 3 4 1 2 1 10.9.8.7 12345", "[rank3]: no newline"}));
  EXPECT_EQ(err, (std::vector<std::string>{"[rank2]: err 0", "[rank3]: err 1"}));
}

TEST_F(Launch, LinesOfWorkersNeverInterleaveEvenWrittenInPieces) {
  // Each line is written in two pieces (two printf calls, two write()s) by both workers at once.
  const std::string script =
      "i=0; while [ $i -lt 300 ]; do printf 'x%s' $i; printf 'y\\n'; printf 'e%s' $i >&2; "
      "printf 'z\\n' >&2; i=$((i+1)); done";
  const LaunchOptions options = two_workers();
  const Outcome result = run({shell_worker(options, 0, script), shell_worker(options, 1, script)});
  ASSERT_EQ(result.code, 0) << result.err;
  for (const auto& [text, first, last] : {std::tuple<std::string, char, char>{result.out, 'x', 'y'},
                                          std::tuple<std::string, char, char>{result.err, 'e', 'z'}}) {
    const std::regex pattern(std::string("\\[rank([01])\\]: ") + first + "([0-9]+)" + last);
    int next[2] = {0, 0};
    for (const auto& line : lines_of(text)) {
      std::smatch match;
      ASSERT_TRUE(std::regex_match(line, match, pattern)) << "mixed line: '" << line << "'";
      const int rank = std::stoi(match[1]);
      EXPECT_EQ(std::stoi(match[2]), next[rank]++) << "rank " << rank << " lines out of order";
    }
    EXPECT_EQ(next[0], 300);
    EXPECT_EQ(next[1], 300);
  }
}

TEST_F(Launch, AFailingWorkerStopsTheOthersQuicklyAndSetsTheExitCode) {
  const LaunchOptions options = two_workers();
  const Outcome result = run({shell_worker(options, 0, "exec sleep 30"),
                          shell_worker(options, 1, "sleep 0.2; echo 'bad input' >&2; exit 3")});
  EXPECT_EQ(result.code, 3);
  EXPECT_LT(result.seconds, 3.0) << "the sleeping worker was not stopped";
  const std::regex failed(R"(\[launch\] rank 1 \(pid [0-9]+\) exited with code 3; stopping the other 1 worker\(s\))");
  EXPECT_TRUE(std::regex_search(result.err, failed)) << result.err;
  EXPECT_TRUE(std::regex_search(result.err, std::regex(R"(rank 0 \(pid [0-9]+\) was killed by signal 15 \(SIGTERM\))")))
      << result.err;
  // The worker's last words come before the launcher's line about it.
  EXPECT_LT(result.err.find("[rank1]: bad input"), result.err.find("[launch] rank 1"));
}

TEST_F(Launch, AWorkerKilledBySignalIsNamedWithTheSignal) {
  const LaunchOptions options = two_workers();
  const Outcome result = run({shell_worker(options, 0, "exec sleep 30"),
                          shell_worker(options, 1, "echo $$; kill -9 $$")});
  EXPECT_EQ(result.code, 128 + 9);
  EXPECT_LT(result.seconds, 3.0);
  std::smatch pid;
  ASSERT_TRUE(std::regex_search(result.out, pid, std::regex(R"(\[rank1\]: ([0-9]+))"))) << result.out;
  EXPECT_TRUE(contains(result.err, "[launch] rank 1 (pid " + pid[1].str() +
                                       ") was killed by signal 9 (SIGKILL); stopping the other 1 worker(s)"))
      << result.err;
}

TEST_F(Launch, AWorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  const LaunchOptions options = two_workers();
  const Outcome result = run({shell_worker(options, 0, "trap '' TERM; touch \"$DIR/ready\"; while :; do sleep 0.05; done"),
                          shell_worker(options, 1, "while [ ! -e \"$DIR/ready\" ]; do sleep 0.02; done; exit 1")},
                         milliseconds(300));
  EXPECT_EQ(result.code, 1);
  EXPECT_LT(result.seconds, 4.0);
  EXPECT_TRUE(contains(result.err, "did not exit within 300 ms of SIGTERM; sending SIGKILL")) << result.err;
  EXPECT_TRUE(std::regex_search(result.err, std::regex(R"(rank 0 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\))")))
      << result.err;
}

TEST_F(Launch, SigintReachesEveryWorkerOnceThroughTheLauncher) {
  // Each worker counts the SIGINTs it gets, stops at the first (as the trainer does after its
  // checkpoint) and reports its process group.
  const std::string script =
      "n=0; trap 'n=$((n+1)); echo \"got INT $n\"' INT; cut -d' ' -f5 /proc/$$/stat; "
      "touch \"$DIR/ready$LOCAL_RANK\"; while [ $n -eq 0 ]; do sleep 0.05; done; sleep 0.3; exit 0";
  const LaunchOptions options = two_workers();
  std::thread interrupter([&] {
    wait_for_files({"ready0", "ready1"});
    ::kill(::getpid(), SIGINT);  // as a Ctrl-C at the terminal reaches the launcher's group
  });
  const Outcome result = run({shell_worker(options, 0, script), shell_worker(options, 1, script)});
  interrupter.join();
  EXPECT_EQ(result.code, 128 + SIGINT);
  EXPECT_LT(result.seconds, 5.0);
  EXPECT_TRUE(contains(result.out, "[rank0]: got INT 1")) << result.out;
  EXPECT_TRUE(contains(result.out, "[rank1]: got INT 1")) << result.out;
  EXPECT_FALSE(contains(result.out, "got INT 2")) << result.out;
  EXPECT_TRUE(contains(result.err, "[launch] SIGINT: forwarding it to 2 worker(s)")) << result.err;
  // Not the launcher's group: a terminal's Ctrl-C does not reach the workers a second time.
  for (int rank = 0; rank < 2; ++rank) {
    std::smatch group;
    const std::regex pattern("\\[rank" + std::to_string(rank) + "\\]: ([0-9]+)");
    ASSERT_TRUE(std::regex_search(result.out, group, pattern)) << result.out;
    EXPECT_NE(std::stoi(group[1]), static_cast<int>(::getpgrp()));
  }
}

TEST_F(Launch, AWorkerThatCannotStartStopsTheStartedOnes) {
  const LaunchOptions options = two_workers();
  WorkerSpec missing = shell_worker(options, 1, "");
  missing.argv = {dir_ + "/no-such-program"};
  const Outcome result = run({shell_worker(options, 0, "exec sleep 30"), missing});
  EXPECT_EQ(result.code, 127);
  EXPECT_LT(result.seconds, 3.0);
  EXPECT_TRUE(contains(result.err, "cannot run '" + dir_ + "/no-such-program': No such file or directory (rank 1); "
                                   "stopping the other 1 worker(s)"))
      << result.err;
}

}  // namespace supervisor_test
}  // namespace
}  // namespace remat::cli::launch
