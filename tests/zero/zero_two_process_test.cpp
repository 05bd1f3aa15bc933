// ZeRO-1 across two real processes on 127.0.0.1 (Gloo): zero_worker trains flux-tiny with plain
// data parallel and with ZeRO-1 from the same start on the same batches; here the weights of the
// two runs are compared bit for bit, between the runs and between the ranks, the gathered ZeRO
// state against the plain run's optimizer state, and the memory each rank saved against the
// memory model.
//
// Bitwise, not a tolerance: both runs reduce the same gradients through the same c10d reducer,
// and an AdamW update depends only on its tensor, gradient and state, so the owner computes the
// same bits as every rank of plain data parallel, and the broadcast copies bytes.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "temp_dir.h"

extern char** environ;

namespace {

// A port no process listens on now: the kernel's choice for port 0.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  close(fd);
  return ntohs(address.sin_port);
}

pid_t spawn_worker(const std::string& output, int rank, int world_size, int port) {
  std::vector<std::string> env_text = {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world_size),
                                       "LOCAL_RANK=" + std::to_string(rank),
                                       "LOCAL_WORLD_SIZE=" + std::to_string(world_size), "MASTER_ADDR=127.0.0.1",
                                       "MASTER_PORT=" + std::to_string(port),
                                       "SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS=60"};
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool ours = false;
    for (const char* name : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=",
                             "MASTER_PORT=", "SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS="}) {
      ours = ours || entry.rfind(name, 0) == 0;
    }
    if (!ours) env_text.push_back(entry);
  }
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string program = REMAT_ZERO_WORKER;
  std::string dir = output;
  std::vector<char*> argv = {program.data(), dir.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv.data(), envp.data());
  EXPECT_EQ(rc, 0) << "posix_spawn " << program;
  return rc == 0 ? pid : -1;
}

// Exit status of `pid`, or -1 after killing it when it runs past `limit`.
int wait_for(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

std::map<std::string, int64_t> read_memory(const std::string& path) {
  std::map<std::string, int64_t> out;
  std::ifstream in(path);
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) out[key] = value;
  return out;
}

// The entries of `file` under `prefix`, by the rest of their name.
std::map<std::string, at::Tensor> under(const remat::io::SafetensorsFile& file, const std::string& prefix) {
  std::map<std::string, at::Tensor> out;
  for (const auto& name : file.names()) {
    if (name.rfind(prefix, 0) == 0) out[name.substr(prefix.size())] = file.tensor(name);
  }
  return out;
}

void expect_bitwise_equal(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b,
                          const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  for (const auto& [name, t] : a) {
    const auto it = b.find(name);
    ASSERT_NE(it, b.end()) << what << ": " << name << " missing";
    ASSERT_EQ(t.scalar_type(), it->second.scalar_type()) << what << ": " << name;
    ASSERT_EQ(t.sizes(), it->second.sizes()) << what << ": " << name;
    EXPECT_TRUE(torch::equal(t, it->second))
        << what << ": " << name << " differs, max |diff| "
        << (t.to(at::kDouble) - it->second.to(at::kDouble)).abs().max().item<double>();
  }
}

TEST(ZeroTwoProcesses, WeightsAndStateEqualPlainDataParallel) {
  remat::testing::TempDir dir("zero_two_process");
  const int port = free_port();
  const pid_t rank0 = spawn_worker(dir.str(), 0, 2, port);
  const pid_t rank1 = spawn_worker(dir.str(), 1, 2, port);
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  const int status0 = wait_for(rank0, std::chrono::seconds(180));
  const int status1 = wait_for(rank1, std::chrono::seconds(30));
  ASSERT_EQ(status0, 0) << "rank 0 failed (-1: timed out)";
  ASSERT_EQ(status1, 0) << "rank 1 failed (-1: timed out)";

  const auto file0 = remat::io::SafetensorsFile::open(dir / "rank0.safetensors");
  const auto file1 = remat::io::SafetensorsFile::open(dir / "rank1.safetensors");
  const auto plain0 = under(file0, "plain/"), zero0 = under(file0, "zero/");
  const auto plain1 = under(file1, "plain/"), zero1 = under(file1, "zero/");
  expect_bitwise_equal(zero0, plain0, "rank 0: ZeRO-1 against plain data parallel");
  expect_bitwise_equal(zero1, plain1, "rank 1: ZeRO-1 against plain data parallel");
  expect_bitwise_equal(zero0, zero1, "ZeRO-1: rank 0 against rank 1");
  expect_bitwise_equal(plain0, plain1, "plain data parallel: rank 0 against rank 1");
  // The training moved every weight (a run that did nothing would pass the comparisons above).
  const auto initial = under(file0, "init/");
  ASSERT_EQ(initial.size(), plain0.size());
  for (const auto& [name, t] : initial) {
    EXPECT_FALSE(torch::equal(t, plain0.at(name))) << name << " did not change";
  }

  // gather_full_state on rank 0: the single-process format, the same values.
  const auto plain_state = under(file0, "plain_state/"), zero_state = under(file0, "zero_state/");
  expect_bitwise_equal(zero_state, plain_state, "rank 0: gathered ZeRO-1 state against plain optimizer_state");
  EXPECT_TRUE(under(file1, "zero_state/").empty()) << "only rank 0 receives the gathered state";

  // Memory: after the steps each rank holds its shard's state instead of the whole.
  for (int rank = 0; rank < 2; ++rank) {
    auto m = read_memory(dir / ("rank" + std::to_string(rank) + ".memory"));
    const int64_t live_saving = m["plain_live"] - m["zero_live"];
    const int64_t predicted = m["state_full"] - m["state_own"];
    const int64_t peak_saving = m["plain_peak"] - m["zero_peak"];
    std::printf("[zero] rank %d: optimizer state %s whole, %s own shard (largest shard %s); live after the steps "
                "saved %s (predicted %s); step peak %s -> %s, saved %s; broadcast buffer %s\n",
                rank, remat::memory::format_bytes(m["state_full"]).c_str(),
                remat::memory::format_bytes(m["state_own"]).c_str(),
                remat::memory::format_bytes(m["state_shard"]).c_str(),
                remat::memory::format_bytes(live_saving).c_str(), remat::memory::format_bytes(predicted).c_str(),
                remat::memory::format_bytes(m["plain_peak"]).c_str(), remat::memory::format_bytes(m["zero_peak"]).c_str(),
                remat::memory::format_bytes(peak_saving).c_str(),
                remat::memory::format_bytes(m["broadcast_buffer"]).c_str());
    EXPECT_GT(predicted, 0) << "rank " << rank << " owns every tensor";
    EXPECT_LE(m["state_own"], m["state_shard"]);
    // Live bytes: exactly the state not kept (the tracking allocator counts requested bytes).
    EXPECT_EQ(live_saving, predicted) << "rank " << rank;
    // The step's peak falls by the state not kept, give or take the broadcast buffer and one
    // tensor's AdamW temporaries (the largest tensor a rank updates differs between the runs;
    // torch's AdamW holds at most three tensor-sized temporaries at once).
    const int64_t slack = m["broadcast_buffer"] + 3 * m["largest_tensor"];
    EXPECT_GE(peak_saving, predicted - slack) << "rank " << rank;
    EXPECT_LE(peak_saving, predicted + slack) << "rank " << rank;
  }
}

}  // namespace
