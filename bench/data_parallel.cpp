// Data-parallel training, 1 process against N (default 2), side by side in one run: median step
// time, per-rank peak, and the share of the step the gradient all-reduce takes
// (docs/PERFORMANCE.md, "Data-parallel training").
//
// Run without torchrun's variables, the program is the driver: for each mode (LoRA, full
// fine-tune) it starts 1 and then N copies of itself with torchrun's environment (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port), each
// with the same per-rank batch (the N-process run trains an N times larger global batch), and
// reads the JSON each rank writes (data_parallel_worker.cpp). With WORLD_SIZE set it is one
// worker, so `torchrun --no-python bench_data_parallel --result_dir D ...` runs the worker alone.
//
// Threads are fixed, not left to LibTorch: each process of a run gets cores / N torch threads
// (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS the same), and the 1-process run the same
// count, so both runs do the same work per process on the same share of the machine; ideally
// the N-process step takes as long as the 1-process one and the difference is what data
// parallelism costs (the all-reduce the backward could not hide, and contention).
//
// usage: bench_data_parallel [--device cpu|cuda] [--preset flux-small | --config config.json]
//          [--modes lora,full] [--lora_rank 16] [--batch 1] [--image_tokens 256] [--text_tokens 64]
//          [--steps 10] [--warmup 2] [--processes 2] [--cores 0 (all)] [--checkpoint off|N]
//          [--dtype float32|bfloat16] [--backend auto|gloo|nccl] [--timeout 300] [--json PATH]
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/version.h>

#include "data_parallel.h"
#include "remat/util/error.h"
#include "remat/memory.h"

extern char** environ;

namespace remat::bench {
namespace {

using nlohmann::json;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A port nobody listens on now (the kernel's choice for port 0); rank 0 opens the store on it.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TORCH_CHECK(fd >= 0, "[bench] socket() failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  TORCH_CHECK(ok, "[bench] could not find a free port on 127.0.0.1");
  return ntohs(address.sin_port);
}

// This process's environment without torchrun's variables and the thread counts, plus `set`.
std::vector<std::string> child_environment(const std::map<std::string, std::string>& set) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    if (set.count(entry.substr(0, entry.find('='))) == 0) out.push_back(entry);
  }
  for (const auto& [name, value] : set) out.push_back(name + "=" + value);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped";
}

// Starts `world` workers of this program and waits for all; returns each rank's JSON. When one
// fails, stops the others and throws naming it.
std::vector<json> run_workers(DataParallelOptions o, int64_t world, const std::string& result_dir) {
  o.result_dir = result_dir + "/world" + std::to_string(world) + (o.full ? "-full" : "-lora");
  std::filesystem::create_directories(o.result_dir);
  const std::string port = std::to_string(free_port());
  const std::string threads = std::to_string(o.threads);
  std::vector<pid_t> pids;
  for (int64_t rank = 0; rank < world; ++rank) {
    std::vector<std::string> args = {"/proc/self/exe"};
    for (const auto& [name, value] : worker_arguments(o)) {
      args.push_back("--" + name);
      args.push_back(value);
    }
    std::vector<std::string> env = child_environment({
        {"RANK", std::to_string(rank)},
        {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(rank)},
        {"LOCAL_WORLD_SIZE", std::to_string(world)},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", port},
        {"SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS", std::to_string(o.timeout)},
        {"OMP_NUM_THREADS", threads},
        {"OPENBLAS_NUM_THREADS", threads},
        {"MKL_NUM_THREADS", threads},
    });
    auto argv = c_strings(args);
    auto envp = c_strings(env);
    pid_t pid = 0;
    const int error = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
    TORCH_CHECK(error == 0, "[bench] could not start worker rank ", rank, ": ", std::strerror(error));
    pids.push_back(pid);
  }
  std::vector<bool> done(pids.size(), false);
  std::string failure;
  for (size_t running = pids.size(); running > 0;) {
    for (size_t r = 0; r < pids.size(); ++r) {
      if (done[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      done[r] = true;
      --running;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && failure.empty()) {
        failure = "rank " + std::to_string(r) + " of " + std::to_string(world) + " " + describe_status(status);
        for (size_t other = 0; other < pids.size(); ++other) {
          if (!done[other]) ::kill(pids[other], SIGTERM);
        }
      }
    }
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  TORCH_CHECK(failure.empty(), "[bench] the ", world, "-process run failed: ", failure, " (its output is above)");
  std::vector<json> results;
  for (int64_t rank = 0; rank < world; ++rank) {
    std::ifstream file(o.result_dir + "/rank" + std::to_string(rank) + ".json");
    TORCH_CHECK(file.good(), "[bench] rank ", rank, " wrote no result in ", o.result_dir);
    results.push_back(json::parse(file));
  }
  return results;
}

// One run's figures over its ranks: per step, the slowest rank's step (the run waits for it) and
// the ranks' mean of everything else; then medians over the steps.
json summarise(const std::vector<json>& ranks, int64_t per_rank_batch) {
  const size_t steps = ranks.front()["steps"].size();
  std::vector<double> step_s, forward_s, backward_s, optimizer_s, all_reduce_s, buckets;
  std::vector<int64_t> peaks;
  for (const auto& r : ranks) {
    int64_t peak = 0;
    for (const auto& s : r["steps"]) peak = std::max(peak, s["peak_bytes"].get<int64_t>());
    peaks.push_back(peak);
  }
  const double n = static_cast<double>(ranks.size());
  for (size_t k = 0; k < steps; ++k) {
    double slowest = 0, f = 0, b = 0, opt = 0, ar = 0, bk = 0;
    for (const auto& r : ranks) {
      const json& s = r["steps"][k];
      slowest = std::max(slowest, s["step_s"].get<double>());
      f += s["forward_s"].get<double>() / n;
      b += s["backward_s"].get<double>() / n;
      opt += s["optimizer_s"].get<double>() / n;
      ar += s["all_reduce_s"].get<double>() / n;
      bk += s["buckets"].get<double>() / n;
    }
    step_s.push_back(slowest);
    forward_s.push_back(f);
    backward_s.push_back(b);
    optimizer_s.push_back(opt);
    all_reduce_s.push_back(ar);
    buckets.push_back(bk);
  }
  const double step = median(step_s), all_reduce = median(all_reduce_s);
  const int64_t processes = static_cast<int64_t>(ranks.size());
  return {{"processes", processes},
          {"backend", ranks.front()["backend"]},
          {"threads_per_process", ranks.front()["threads"]},
          {"per_rank_batch", per_rank_batch},
          {"global_batch", per_rank_batch * processes},
          {"median_step_s", step},
          {"median_forward_s", median(forward_s)},
          {"median_backward_s", median(backward_s)},
          {"median_optimizer_s", median(optimizer_s)},
          {"median_all_reduce_s", all_reduce},
          {"all_reduce_share", step > 0 ? all_reduce / step : 0.0},
          {"buckets_per_step", median(buckets)},
          {"all_reduce_bytes_per_step", ranks.front()["steps"][0]["all_reduce_bytes"]},
          {"samples_per_s", step > 0 ? static_cast<double>(per_rank_batch * processes) / step : 0.0},
          {"per_rank_peak_bytes", peaks},
          {"max_rank_peak_bytes", *std::max_element(peaks.begin(), peaks.end())},
          {"step_s", step_s},
          {"last_loss_per_rank", [&] {
             std::vector<double> v;
             for (const auto& r : ranks) v.push_back(r["last_loss"].get<double>());
             return v;
           }()}};
}

std::string fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

int run_driver(DataParallelOptions o) {
  const bool cuda = o.device == "cuda";
  if (cuda) {
    const auto gpus = static_cast<int64_t>(torch::cuda::device_count());
    TORCH_CHECK_VALUE(o.processes <= gpus, "[bench] --processes ", o.processes, " needs that many GPUs, ", gpus,
                      " visible");
  }
  const int64_t cores = o.cores > 0 ? o.cores : std::max<int64_t>(1, std::thread::hardware_concurrency());
  o.threads = std::max<int64_t>(1, cores / o.processes);
  std::string scratch = (std::filesystem::temp_directory_path() / "remat-dp-XXXXXX").string();
  TORCH_CHECK(::mkdtemp(scratch.data()) != nullptr, "[bench] could not create a directory under ",
              std::filesystem::temp_directory_path().string());

  const std::string model = o.config.empty() ? o.preset : o.config;
  std::printf("data-parallel training: flux %s, %s on %s, per-rank batch %lld, %lld image + %lld text tokens, "
              "checkpointing %s, %lld warm-up + %lld measured steps\n",
              model.c_str(), o.dtype.c_str(), o.device.c_str(), static_cast<long long>(o.batch),
              static_cast<long long>(o.image_tokens), static_cast<long long>(o.text_tokens), o.checkpoint.c_str(),
              static_cast<long long>(o.warmup), static_cast<long long>(o.steps));
  std::printf("threads: %lld cores / %lld processes = %lld torch thread(s) per process (OMP/OpenBLAS/MKL too); "
              "the 1-process run gets the same %lld, so both runs give each process the same share\n",
              static_cast<long long>(cores), static_cast<long long>(o.processes), static_cast<long long>(o.threads),
              static_cast<long long>(o.threads));
  std::fflush(stdout);

  json report = {{"device", o.device},
                 {"model", model},
                 {"dtype", o.dtype},
                 {"checkpoint", o.checkpoint},
                 {"per_rank_batch", o.batch},
                 {"image_tokens", o.image_tokens},
                 {"text_tokens", o.text_tokens},
                 {"steps", o.steps},
                 {"warmup", o.warmup},
                 {"cores", cores},
                 {"threads_per_process", o.threads},
                 {"libtorch", TORCH_VERSION},
                 {"modes", json::array()}};
  std::vector<std::string> rows;
  std::vector<std::string> notes;
  std::stringstream modes(o.modes);
  for (std::string mode; std::getline(modes, mode, ',');) {
    o.full = mode == "full";
    json runs = json::array();
    json single, multi;
    std::vector<json> single_ranks;
    for (const int64_t world : {int64_t{1}, o.processes}) {
      std::fprintf(stderr, "[bench] %s, %lld process(es)\n", mode.c_str(), static_cast<long long>(world));
      const std::vector<json> ranks = run_workers(o, world, scratch);
      json s = summarise(ranks, o.batch);
      (world == 1 ? single : multi) = s;
      if (world == 1) single_ranks = ranks;
      runs.push_back(s);
    }
    const std::string name = o.full ? "full" : "LoRA r" + std::to_string(o.lora_rank);
    const int64_t trainable = single_ranks.front()["trainable_parameters"];
    for (const json& s : runs) {
      const auto peaks = s["per_rank_peak_bytes"].get<std::vector<int64_t>>();
      std::string peak_text;
      for (const int64_t p : peaks) peak_text += (peak_text.empty() ? "" : " / ") + memory::format_bytes(p);
      const bool distributed = s["processes"].get<int64_t>() > 1;
      rows.push_back("| " + name + " | " + std::to_string(s["processes"].get<int64_t>()) + " | " +
                     std::to_string(s["global_batch"].get<int64_t>()) + " | " + fixed(s["median_step_s"], 4) +
                     " | " + fixed(s["median_forward_s"], 4) + " | " + fixed(s["median_backward_s"], 4) + " | " +
                     fixed(s["median_optimizer_s"], 4) + " | " + peak_text + " | " +
                     (distributed ? fixed(s["median_all_reduce_s"], 4) : "-") + " | " +
                     (distributed ? fixed(100.0 * s["all_reduce_share"].get<double>(), 1) + "%" : "-") + " | " +
                     (distributed ? fixed(s["buckets_per_step"], 0) : "-") + " | " + fixed(s["samples_per_s"], 2) +
                     " |");
    }
    const double t1 = single["median_step_s"], tn = multi["median_step_s"];
    const json comparison = {{"step_ratio", tn / t1},
                             {"exposed_overhead_s", tn - t1},
                             {"exposed_overhead_share", (tn - t1) / tn},
                             {"all_reduce_share", multi["all_reduce_share"]},
                             {"throughput_ratio", multi["samples_per_s"].get<double>() / single["samples_per_s"].get<double>()},
                             {"peak_ratio", multi["max_rank_peak_bytes"].get<double>() /
                                                single["max_rank_peak_bytes"].get<double>()}};
    notes.push_back(name + " (" + std::to_string(trainable) + " trainable parameters, " +
                    memory::format_bytes(multi["all_reduce_bytes_per_step"].get<int64_t>()) +
                    " all-reduced per step): " + std::to_string(o.processes) + "-process step / 1-process step = " +
                    fixed(comparison["step_ratio"], 3) + ", exposed overhead " +
                    fixed(comparison["exposed_overhead_s"], 4) + " s (" +
                    fixed(100.0 * comparison["exposed_overhead_share"].get<double>(), 1) +
                    "% of the " + std::to_string(o.processes) + "-process step); all-reduce busy " +
                    fixed(100.0 * multi["all_reduce_share"].get<double>(), 1) + "% of the step; throughput x" +
                    fixed(comparison["throughput_ratio"], 2) + "; per-rank peak x" +
                    fixed(comparison["peak_ratio"], 3));
    report["modes"].push_back({{"mode", mode},
                               {"trainable_parameters", trainable},
                               {"trainable_bytes", single_ranks.front()["trainable_bytes"]},
                               {"runs", runs},
                               {"comparison", comparison}});
  }
  std::filesystem::remove_all(scratch);

  std::printf("\n| mode | processes | global batch | step (s) | forward (s) | backward (s) | sync+optimizer (s) "
              "| peak per rank | all-reduce busy (s) | all-reduce share | buckets | samples/s |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto& row : rows) std::printf("%s\n", row.c_str());
  std::printf("\n");
  for (const auto& note : notes) std::printf("%s\n", note.c_str());
  std::printf("(medians over steps; a step's time is its slowest rank's; all-reduce busy = the sum over buckets of "
              "launch-to-completion seconds, overlapping backward; exposed overhead = median N-process step minus "
              "median 1-process step)\n");
  if (!o.json.empty()) {
    std::ofstream file(o.json);
    file << report.dump(2) << "\n";
    TORCH_CHECK(file.good(), "[bench] could not write ", o.json);
    std::printf("wrote %s\n", o.json.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace remat::bench

int main(int argc, char** argv) {
  remat::memory::install_cpu_tracking();
  try {
    const remat::bench::DataParallelOptions options = remat::bench::parse_data_parallel_options(argc, argv);
    if (std::getenv("WORLD_SIZE") != nullptr) return remat::bench::run_data_parallel_worker(options);
    return remat::bench::run_driver(options);
  } catch (const c10::ValueError& e) {
    std::fprintf(stderr, "%s\n", e.what_without_backtrace());
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
