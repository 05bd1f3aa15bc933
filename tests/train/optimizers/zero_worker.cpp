// One rank of the ZeRO-1 two-process test (zero_two_process_test.cpp starts two of these with
// torchrun's environment). It trains flux-tiny for kSteps steps twice from the same start, on
// the same per-rank batches: plain data parallel (GradientReducer + torch-adamw), then ZeRO-1
// (GradientReducer + ZeroRedundancyOptimizer over the same settings). It writes
// <out>/rank<R>.safetensors with the final weights of both runs ("plain/<name>", "zero/<name>"),
// on rank 0 also both optimizer states ("plain_state/...": optimizer_state of the plain run,
// "zero_state/...": gather_full_state of the ZeRO run), and <out>/rank<R>.memory with the bytes
// measured by the tracking allocator (remat::memory).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "remat/distributed/environment.h"
#include "remat/distributed/gradient_reducer.h"
#include "remat/distributed/process_group.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/run/reducer_synchronizer.h"
#include "remat/train/run/step.h"
#include "remat/train/family/transformer.h"
#include "remat/train/optimizers/zero_optimizer.h"

namespace {

using namespace remat;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

constexpr int kSteps = 3;
constexpr uint64_t kModelSeed = 1234;

struct RunResult {
  Named initial;          // clones of the trainable weights before the first step
  Named weights;          // clones of the final trainable weights
  Named state;            // rank 0: the full optimizer state
  int64_t live_bytes = 0; // allocated after the last step, above the baseline before the model
  int64_t peak_bytes = 0; // the last step's peak, above the same baseline
};

RunResult train_steps(distributed::ProcessGroup& group, bool zero) {
  const int64_t baseline = memory::current_bytes();
  torch::manual_seed(kModelSeed);  // the same start on every rank and in both runs
  train::TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = "flux-tiny";
  auto model = train::make_transformer(spec, at::Device(at::kCPU));
  model->module().train();
  Named named = model->trainable_parameters();
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& [name, p] : named) {
    params.push_back(p);
    names.push_back(name);
  }
  const train::OptimizerSettings settings = train::OptimizerSettings::defaults_of("torch-adamw", 1e-3);
  std::unique_ptr<torch::optim::Optimizer> plain;
  std::unique_ptr<train::ZeroRedundancyOptimizer> sharded;
  if (zero) sharded = std::make_unique<train::ZeroRedundancyOptimizer>(group, params, settings);
  else plain = train::make_optimizer(params, settings);
  torch::optim::Optimizer& optimizer = zero ? static_cast<torch::optim::Optimizer&>(*sharded) : *plain;

  distributed::GradientReducer reducer(group, params, names);
  train::ReducerSynchronizer sync(reducer);
  train::StepSettings step_settings;
  step_settings.max_grad_norm = 0.05;  // small: clipping scales every step
  train::TrainingStep step(*model, optimizer, params, step_settings);
  step.set_gradient_synchronizer(&sync);
  train::PeakMemoryObserver peak;
  step.add_observer(&peak);

  RunResult out;
  for (const auto& [name, p] : named) out.initial.emplace_back(name, p.detach().clone());
  for (int k = 0; k < kSteps; ++k) {
    // A different learning rate each step: ZeRO forwards set_learning_rate to its shard's optimizer.
    train::set_learning_rate(optimizer, 1e-3 * (k + 1));
    // Each rank its own data; the same in both runs.
    at::Generator data = at::detail::createCPUGenerator(1000 + 100 * group.rank() + k);
    const train::Batch batch = model->synthetic_batch(1, 16, 8, data, at::Device(at::kCPU));
    step.run({batch}, data);
  }
  // Gloo's worker thread drops its reference to a broadcast's buffer just after the broadcast
  // completes, so the last buffer may outlive the step by a moment: wait until nothing more is freed.
  group.barrier("the end of the steps");
  int64_t live = memory::current_bytes();
  for (int quiet = 0, polls = 0; quiet < 5 && polls < 400; ++polls) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const int64_t now = memory::current_bytes();
    quiet = now == live ? quiet + 1 : 0;
    live = now;
  }
  out.live_bytes = live - baseline;
  out.peak_bytes = peak.peak_bytes() - baseline;
  for (const auto& [name, p] : named) out.weights.emplace_back(name, p.detach().clone());
  Named state = zero ? sharded->gather_full_state(named) : train::optimizer_state(*plain, named);
  if (group.rank() == 0) {
    for (auto& [name, t] : state) out.state.emplace_back(name, t.clone());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_cpu_tracking();
  torch::set_num_threads(1);
  if (argc != 2) {
    std::cerr << "usage: zero_worker OUTPUT_DIR (with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)\n";
    return 2;
  }
  const std::string dir = argv[1];
  try {
    const auto env = distributed::read_launch_environment();
    auto group = distributed::ProcessGroup::connect(env, distributed::Backend::gloo);
    const RunResult plain = train_steps(*group, false);
    const RunResult zero = train_steps(*group, true);

    std::vector<io::NamedTensor> entries;
    for (const auto& [name, t] : plain.initial) entries.emplace_back("init/" + name, t);
    for (const auto& [name, t] : plain.weights) entries.emplace_back("plain/" + name, t);
    for (const auto& [name, t] : zero.weights) entries.emplace_back("zero/" + name, t);
    for (const auto& [name, t] : plain.state) entries.emplace_back("plain_state/" + name, t);
    for (const auto& [name, t] : zero.state) entries.emplace_back("zero_state/" + name, t);
    const std::string rank = std::to_string(env.rank);
    io::save_safetensors(dir + "/rank" + rank + ".safetensors", entries);

    // What the memory model predicts ZeRO-1 saves on this model: the whole state less the shard.
    std::vector<at::Tensor> params;
    for (const auto& [name, t] : plain.weights) params.push_back(t);
    const auto settings = train::OptimizerSettings::defaults_of("torch-adamw", 1e-3);
    std::vector<int64_t> sizes;
    for (const auto& p : params) sizes.push_back(static_cast<int64_t>(p.numel() * p.element_size()));
    const std::vector<int> owners = train::assign_to_ranks(sizes, env.world_size);
    std::vector<at::Tensor> owned;
    for (size_t i = 0; i < params.size(); ++i) {
      if (owners[i] == env.rank) owned.push_back(params[i]);
    }
    std::ofstream memory_file(dir + "/rank" + rank + ".memory");
    memory_file << "plain_live " << plain.live_bytes << "\nzero_live " << zero.live_bytes << "\nplain_peak "
                << plain.peak_bytes << "\nzero_peak " << zero.peak_bytes << "\nstate_full "
                << train::optimizer_state_bytes(settings, params) << "\nstate_shard "
                << train::zero_state_bytes_per_rank(settings, params, env.world_size) << "\nstate_own "
                << train::optimizer_state_bytes(settings, owned) << "\nlargest_tensor "
                << *std::max_element(sizes.begin(), sizes.end()) << "\nbroadcast_buffer "
                << train::zero_broadcast_buffer_bytes(params, env.world_size) << "\n";
    group->barrier("the end of the test");
  } catch (const std::exception& e) {
    std::cerr << "zero_worker: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
