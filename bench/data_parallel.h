#pragma once
// bench_data_parallel's two roles (bench/data_parallel.cpp): the driver, which starts the
// processes and reports, and the worker, one rank of a data-parallel run, which trains and writes
// what it measured to a JSON file.

#include <cstdint>
#include <map>
#include <string>

namespace remat::bench {

/// The command line, shared by both roles: the driver passes its options on to the workers.
struct DataParallelOptions {
  std::string device = "cpu";       ///< cpu | cuda (each rank on cuda:LOCAL_RANK)
  std::string backend = "auto";     ///< auto (NCCL on CUDA, Gloo on CPU) | gloo | nccl
  std::string preset = "flux-small";
  std::string config;               ///< a diffusers config.json (overrides preset)
  std::string dtype = "float32";    ///< float32 | bfloat16 (bf16 weights and autocast)
  std::string modes = "lora,full";  ///< lora (rank lora_rank) and/or full (full fine-tune)
  std::string checkpoint = "off";   ///< off | N (SimpleTuner interval N, torch backend)
  int64_t lora_rank = 16;
  int64_t batch = 1;                ///< per-rank batch (global batch = processes x batch)
  int64_t image_tokens = 256;
  int64_t text_tokens = 64;
  int64_t steps = 10;               ///< measured steps
  int64_t warmup = 2;               ///< unmeasured steps first (optimizer state, bucket rebuild)
  int64_t processes = 2;            ///< the multi-process run's size (the other run has 1)
  int64_t cores = 0;                ///< cores to divide among a run's processes; 0: all of them
  int64_t seed = 0;
  int64_t timeout = 300;            ///< SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS for the workers
  std::string json;                 ///< driver: write the report here too
  // Worker only (set by the driver).
  std::string result_dir;           ///< where each rank writes rank<R>.json
  int64_t threads = 1;              ///< torch threads of this process
  bool full = false;                ///< this worker's mode: full fine-tune (else LoRA)
};

/// Parses "--name value" pairs. Throws c10::ValueError naming an unknown option or a bad value.
DataParallelOptions parse_data_parallel_options(int argc, char** argv);

/// The worker's options as command-line arguments (inverse of parse_data_parallel_options).
std::map<std::string, std::string> worker_arguments(const DataParallelOptions& options);

/// One rank: joins the run described by the environment (torchrun's variables), trains
/// options.warmup + options.steps steps and writes rank<R>.json into options.result_dir.
int run_data_parallel_worker(const DataParallelOptions& options);

}  // namespace remat::bench
