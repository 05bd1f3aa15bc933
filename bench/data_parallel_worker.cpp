// One rank of bench_data_parallel: a Flux training step run through remat's TrainingStep with
// its gradients kept in step by remat::distributed::GradientReducer (c10d::Reducer), timed and
// peak-tracked step by step, written to <result_dir>/rank<R>.json for the driver.
#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/DeviceGuard.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "data_parallel.h"
#include "remat/checkpoint_plan.h"
#include "remat/distributed/environment.h"
#include "remat/distributed/gradient_reducer.h"
#include "remat/distributed/process_group.h"
#include "remat/memory.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/run/reducer_synchronizer.h"
#include "remat/train/run/step.h"
#include "remat/train/family/transformer.h"

namespace remat::bench {
namespace {

CheckpointPlan plan_of(const std::string& checkpoint) {
  if (checkpoint == "off") return CheckpointPlan::off();
  return CheckpointPlan::simpletuner(true, std::stoll(checkpoint), std::nullopt, "torch");
}

}  // namespace

int run_data_parallel_worker(const DataParallelOptions& o) {
  const distributed::LaunchEnvironment env = distributed::read_launch_environment();
  TORCH_CHECK_VALUE(!o.result_dir.empty(), "[bench] a worker needs --result_dir (where rank<R>.json goes)");
  const bool cuda = o.device == "cuda";
  TORCH_CHECK_VALUE(!cuda || torch::cuda::is_available(),
                    "[bench] device must be cpu on this machine (no CUDA device available), got 'cuda'");
  TORCH_CHECK_VALUE(!cuda || env.local_rank < static_cast<int>(torch::cuda::device_count()), "[bench] ",
                    env.describe(), ": LOCAL_RANK ", env.local_rank, " has no GPU (", torch::cuda::device_count(),
                    " visible)");
  const at::Device device = cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank))
                                 : at::Device(at::kCPU);
  // The current device for the whole run: NCCL's communicators and the caching allocator's
  // statistics follow it (device-generic, no CUDA header).
  std::optional<c10::DeviceGuard> device_guard;
  if (cuda) device_guard.emplace(device);
  torch::set_num_threads(static_cast<int>(o.threads));

  std::unique_ptr<distributed::ProcessGroup> group;
  if (env.distributed()) {
    group = distributed::ProcessGroup::connect(env, distributed::choose_backend(o.backend, device));
  }

  // Every rank builds the same model from the same seed; rank 0's weights are broadcast anyway,
  // as DistributedDataParallel does, so the ranks start equal whatever the device's RNG does.
  torch::manual_seed(o.seed);
  train::TransformerSpec spec;
  spec.family = "flux";
  if (o.config.empty()) spec.flavour = o.preset;
  else spec.config_json = o.config;
  auto model = train::make_transformer(spec, device);
  const bool bf16 = o.dtype == "bfloat16";
  if (bf16) model->module().to(at::kBFloat16);
  if (!o.full) model->apply_lora("default", o.lora_rank, static_cast<double>(o.lora_rank));
  model->module().train();
  model->set_checkpoint_plan(plan_of(o.checkpoint));
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  int64_t trainable = 0, trainable_bytes = 0;
  for (const auto& [name, p] : model->trainable_parameters()) {
    params.push_back(p);
    names.push_back(name);
    trainable += p.numel();
    trainable_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  if (group) {
    std::vector<at::Tensor> weights;
    for (const auto& p : model->module().parameters()) weights.push_back(p.detach());
    group->broadcast(weights, 0, "broadcasting rank 0's initial weights");
  }
  train::OptimizerSettings optimizer_settings;
  optimizer_settings.learning_rate = 1e-5;
  const auto optimizer = train::make_optimizer(params, optimizer_settings);

  // Each rank its own samples (data parallelism); the noise stream per rank as well.
  at::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(o.seed * 1000 + env.rank + 1));
  const train::Batch batch = model->synthetic_batch(o.batch, o.image_tokens, o.text_tokens, generator, device);
  train::StepSettings settings;
  if (bf16) settings.autocast = at::kBFloat16;

  std::atomic<int64_t> bytes_launched{0};
  std::unique_ptr<distributed::GradientReducer> reducer;
  std::unique_ptr<train::ReducerSynchronizer> synchronizer;
  if (group) {
    distributed::ReducerOptions reducer_options;
    // Also installs the reducer's timing of each bucket's all-reduce (ReducerStats).
    reducer_options.on_bucket = [&bytes_launched](const distributed::BucketLaunch& b) { bytes_launched += b.bytes; };
    reducer = std::make_unique<distributed::GradientReducer>(*group, params, names, reducer_options);
    synchronizer = std::make_unique<train::ReducerSynchronizer>(*reducer);
  }
  train::TrainingStep step(*model, *optimizer, params, settings);
  train::TimingObserver timing;
  train::PeakMemoryObserver peak;
  step.add_observer(&timing);
  step.add_observer(&peak);
  step.set_gradient_synchronizer(synchronizer.get());

  nlohmann::json steps = nlohmann::json::array();
  double first_loss = 0.0, last_loss = 0.0;
  for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
    // Outside the timed step: every rank starts together, so a step's time is its own.
    if (group) group->barrier("starting step " + std::to_string(i));
    const distributed::ReducerStats before = reducer ? reducer->stats() : distributed::ReducerStats{};
    bytes_launched = 0;
    const train::StepResult result = step.run({batch}, generator);
    const double loss = result.loss();  // reads the device (after step_end's timing)
    if (i < o.warmup) continue;
    const distributed::ReducerStats after = reducer ? reducer->stats() : distributed::ReducerStats{};
    const train::StepMeasurement& t = timing.times();
    steps.push_back({{"step_s", t.step_s},
                     {"forward_s", t.forward_s},
                     {"backward_s", t.backward_s},
                     {"optimizer_s", t.optimizer_s},
                     {"peak_bytes", peak.peak_bytes()},
                     {"all_reduce_s", after.all_reduce_seconds - before.all_reduce_seconds},
                     {"buckets", after.buckets_launched - before.buckets_launched},
                     {"all_reduce_bytes", bytes_launched.load()},
                     {"loss", loss}});
    if (i == o.warmup) first_loss = loss;
    last_loss = loss;
  }
  nlohmann::json out = {{"rank", env.rank},
                        {"world_size", env.world_size},
                        {"local_rank", env.local_rank},
                        {"device", device.str()},
                        {"backend", group ? distributed::to_string(group->backend()) : "none"},
                        {"threads", torch::get_num_threads()},
                        {"mode", o.full ? "full" : "lora"},
                        {"trainable_parameters", trainable},
                        {"trainable_bytes", trainable_bytes},
                        {"bucket_count", reducer ? static_cast<int64_t>(reducer->bucket_count()) : 0},
                        {"first_loss", first_loss},
                        {"last_loss", last_loss},
                        {"steps", steps}};
  if (group) group->barrier("finishing");
  const std::string path = o.result_dir + "/rank" + std::to_string(env.rank) + ".json";
  std::ofstream file(path);
  file << out.dump(1) << "\n";
  TORCH_CHECK(file.good(), "[bench] could not write ", path);
  return 0;
}

}  // namespace remat::bench
