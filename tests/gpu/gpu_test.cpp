// What only a CUDA device can show: checkpointing and the offload backend on the device (streams,
// events, pinned host memory), the caching allocator's figures behind memory admission, the Flux
// model's training step, the text encoders, transformer and VAE of a pipeline on the device, the
// trainer with --device cuda, and NCCL. Each result is compared with an independent computation
// on the device or the CPU. Run by gpu_main.cpp only where a CUDA device is visible.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "rank_processes.h"
#include "remat/activation_offload.h"
#include "remat/checkpoint.h"
#include "remat/distributed/environment.h"
#include "remat/distributed/process_group.h"
#include "remat/encoders/demo_pipeline.h"
#include "remat/memory.h"
#include "remat/models/flux.h"
#include "remat/sample/pipeline.h"
#include "remat/train/family/text_to_image.h"
#include "remat/train/options/config.h"
#include "remat/train/run/trainer.h"
#include "flux_tiny_dataset.h"
#include "temp_dir.h"
#include "train/quiet_hooks.h"

namespace remat {
namespace {
namespace gpu_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

const c10::Device kCuda(c10::kCUDA, 0);

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kCPU, at::kDouble) - b.to(at::kCPU, at::kDouble)).abs().max().item<double>();
}

// Eight residual MLP blocks on the device, wide enough that their activations dominate memory:
// y = x + W2 gelu(W1 x), x of (T, D), hidden H.
struct DeviceChain {
  static constexpr int64_t kBlocks = 8, T = 2048, D = 256, H = 2048;
  std::vector<at::Tensor> w1, w2;
  DeviceChain() {
    torch::manual_seed(0);
    for (int64_t i = 0; i < kBlocks; ++i) {
      w1.push_back((torch::randn({H, D}) * 0.03).to(kCuda).requires_grad_());
      w2.push_back((torch::randn({D, H}) * 0.03).to(kCuda).requires_grad_());
    }
  }
  Tensors block(int64_t i, const Tensors& s) const {
    return {s[0] + torch::matmul(torch::gelu(torch::matmul(s[0], w1[i].t())), w2[i].t())};
  }
  struct Run {
    at::Tensor output;
    std::vector<at::Tensor> grads;
    int64_t held_after_forward = 0;  // device bytes the graph keeps between forward and backward
    int64_t peak = 0;                // device peak above the start, forward and backward
  };
  // segment_size 0: no checkpointing; `offload`: every block inside an OffloadSavedTensors scope.
  Run run(int64_t segment_size, Backend backend, const std::optional<SavedTensorOffload>& offload = std::nullopt) {
    for (auto& w : w1) w.mutable_grad().reset();
    for (auto& w : w2) w.mutable_grad().reset();
    torch::manual_seed(1);
    const at::Tensor x = torch::randn({T, D}).to(kCuda).requires_grad_();
    torch::cuda::synchronize();
    memory::PeakScope scope(kCuda);
    const RunBlock run_block = [this, offload](int64_t i, const Tensors& s) {
      const OffloadSavedTensors scope(offload);
      return block(i, s);
    };
    Tensors out;
    if (segment_size == 0) {
      out = {x};
      for (int64_t i = 0; i < kBlocks; ++i) out = run_block(i, out);
    } else {
      CheckpointOptions options;
      options.backend = backend;
      out = checkpoint_sequential_state(kBlocks, segment_size, {x}, run_block, options);
    }
    torch::cuda::synchronize();
    Run r;
    r.held_after_forward = memory::current_bytes(kCuda) - scope.baseline_bytes();
    out[0].square().sum().backward();
    torch::cuda::synchronize();
    r.peak = scope.peak_delta();
    r.output = out[0].detach();
    for (auto& w : w1) r.grads.push_back(w.grad().clone());
    for (auto& w : w2) r.grads.push_back(w.grad().clone());
    r.grads.push_back(x.grad().clone());
    return r;
  }
};

void expect_same_gradients(const DeviceChain::Run& got, const DeviceChain::Run& want) {
  EXPECT_LE(max_abs_diff(got.output, want.output), 1e-5 * (1 + want.output.abs().max().item<double>()));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    const double scale = 1 + want.grads[i].abs().max().item<double>();
    EXPECT_LE(max_abs_diff(got.grads[i], want.grads[i]), 1e-4 * scale) << "gradient " << i;
  }
}

TEST(GpuMemory, CachingAllocatorFiguresCountATensor) {
  ASSERT_TRUE(memory::cuda_statistics_available());
  torch::cuda::synchronize();
  const int64_t before = memory::current_bytes(kCuda);
  memory::PeakScope scope(kCuda);
  {
    const at::Tensor t = torch::empty({1 << 20}, torch::TensorOptions().device(kCuda));  // 4 MiB
    EXPECT_EQ(memory::current_bytes(kCuda) - before, int64_t{4} << 20);
  }
  EXPECT_EQ(memory::current_bytes(kCuda), before);
  EXPECT_EQ(scope.peak_delta(), int64_t{4} << 20);
  // Admission's budget: the driver's free memory plus what the allocator holds, at most the card.
  const int64_t available = memory::available_bytes(kCuda);
  EXPECT_GT(available, int64_t{1} << 30);
  EXPECT_LT(available, int64_t{1024} << 30);
}

TEST(GpuCheckpoint, SegmentsGiveThePlainGradientsAndHoldLess) {
  DeviceChain chain;
  const auto plain = chain.run(0, Backend::Recompute);
  const auto segmented = chain.run(2, Backend::Recompute);
  expect_same_gradients(segmented, plain);
  // Between forward and backward only the segment boundaries stay: far less than every block's
  // activations (two (T, H) tensors per block).
  EXPECT_LT(segmented.held_after_forward, plain.held_after_forward / 3)
      << segmented.held_after_forward << " vs " << plain.held_after_forward;
  EXPECT_LT(segmented.peak, plain.peak);
  std::printf("device bytes held after forward: plain %lld, interval 2 %lld; peak %lld vs %lld\n",
              static_cast<long long>(plain.held_after_forward), static_cast<long long>(segmented.held_after_forward),
              static_cast<long long>(plain.peak), static_cast<long long>(segmented.peak));
}

TEST(GpuCheckpoint, OffloadMovesSegmentInputsToPinnedHostMemory) {
  DeviceChain chain;
  const auto plain = chain.run(0, Backend::Recompute);
  const auto recompute = chain.run(2, Backend::Recompute);
  const auto offload = chain.run(2, Backend::Offload);
  expect_same_gradients(offload, plain);
  // The segment inputs (T x D fp32 each) left the device for pinned host memory: less is held
  // there than with recomputation alone, by at least one of them.
  EXPECT_LT(offload.held_after_forward, recompute.held_after_forward)
      << offload.held_after_forward << " vs " << recompute.held_after_forward;
  EXPECT_GE(recompute.held_after_forward - offload.held_after_forward, DeviceChain::T * DeviceChain::D * 4);
}

// Saved-tensor offload (gradient_checkpointing_offload_attention's mechanism) on the device: what
// the blocks save goes to pinned host buffers of the pool on the copy stream and comes back,
// bitwise, just in time or prefetched, pinned or (cap 0) pageable.
TEST(GpuActivationOffload, SavedTensorsLeaveTheDeviceAndComeBackBitwise) {
  DeviceChain chain;
  const auto plain = chain.run(0, Backend::Recompute);
  set_offload_pin_memory_max_buckets(kDefaultOffloadPinMemoryMaxBuckets);
  for (const auto& [label, offload, buckets] :
       {std::tuple<std::string, SavedTensorOffload, int64_t>{"just in time", SavedTensorOffload{false}, 12},
        {"prefetch", SavedTensorOffload{true}, 12},
        {"pageable (cap 0)", SavedTensorOffload{true}, 0}}) {
    set_offload_pin_memory_max_buckets(buckets);
    reset_saved_tensor_offload_stats();
    reset_offload_pool_stats();
    const auto offloaded = chain.run(0, Backend::Recompute, offload);
    EXPECT_TRUE(torch::equal(offloaded.output, plain.output)) << label;
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(offloaded.grads[i], plain.grads[i])) << label << ": gradient " << i;
    }
    const SavedTensorOffloadStats s = saved_tensor_offload_stats();
    const OffloadPoolStats pool = offload_pool_stats();
    EXPECT_EQ(s.bytes_to_device, s.bytes_to_host) << label;
    EXPECT_EQ(s.prefetched > 0, offload.prefetch) << label;
    EXPECT_EQ(pool.pooled_checkouts > 0, buckets > 0) << label;
    // Two (T, H) activations a block stay on the device without the offload.
    EXPECT_LT(offloaded.held_after_forward, plain.held_after_forward / 4)
        << label << ": " << offloaded.held_after_forward << " vs " << plain.held_after_forward;
    std::printf("saved-tensor offload, %s: device bytes held after forward %lld (plain %lld), peak %lld (plain %lld), "
                "%lld bytes to host\n",
                label.c_str(), static_cast<long long>(offloaded.held_after_forward),
                static_cast<long long>(plain.held_after_forward), static_cast<long long>(offloaded.peak),
                static_cast<long long>(plain.peak), static_cast<long long>(s.bytes_to_host));
  }
  set_offload_pin_memory_max_buckets(kDefaultOffloadPinMemoryMaxBuckets);
}

TEST(GpuFlux, CheckpointedTrainingStepOnTheDeviceMatchesTheCpu) {
  torch::manual_seed(0);
  models::FluxConfig config = models::FluxConfig::preset("flux-tiny");
  models::Flux cpu_model(config);
  models::Flux gpu_model(config);
  {
    torch::NoGradGuard no_grad;
    const auto from = cpu_model->named_parameters();
    for (auto& item : gpu_model->named_parameters()) item.value().copy_(from[item.key()]);
  }
  cpu_model->to(at::kDouble);
  gpu_model->to(kCuda);
  gpu_model->set_checkpoint_plan(CheckpointPlan::simpletuner(true, 2, std::nullopt, "unsloth"));
  const int64_t B = 2;
  const at::Tensor hidden = torch::randn({B, 16, 64}), text = torch::randn({B, 8, 32}), pooled = torch::randn({B, 16});
  const at::Tensor timestep = torch::tensor({0.3, 0.8}), guidance = torch::tensor({3.5, 4.0});
  const at::Tensor weight = torch::randn({B, 16, 64});
  auto step = [&](models::Flux& model, c10::Device device, at::ScalarType dtype) {
    auto on = [&](const at::Tensor& t) { return t.to(device, dtype); };
    const at::Tensor out = model->forward(on(hidden), on(text), on(pooled), on(timestep),
                                          models::flux_image_ids(4, 4).to(device, dtype),
                                          models::flux_text_ids(8).to(device, dtype), on(guidance));
    (out * on(weight)).sum().backward();
    return out.detach();
  };
  const at::Tensor want = step(cpu_model, c10::kCPU, at::kDouble);
  const at::Tensor got = step(gpu_model, kCuda, at::kFloat);
  EXPECT_LE(max_abs_diff(got, want), 1e-4 * (1 + want.abs().max().item<double>()));
  const auto cpu_params = cpu_model->named_parameters();
  int compared = 0;
  for (const auto& item : gpu_model->named_parameters()) {
    const at::Tensor& g = item.value().grad();
    const at::Tensor& w = cpu_params[item.key()].grad();
    ASSERT_EQ(g.defined(), w.defined()) << item.key();
    if (!g.defined()) continue;
    EXPECT_LE(max_abs_diff(g, w), 2e-3 * (1 + w.abs().max().item<double>())) << item.key();
    ++compared;
  }
  EXPECT_GT(compared, 50);
}

TEST(GpuPipeline, TextEncodersTransformerAndVaeOnTheDeviceMatchTheCpu) {
  testing::TempDir dir("remat_gpu_pipeline");
  encoders::write_demo_pipeline(dir / "pipeline");
  sample::PipelineOptions options;
  options.folder = dir / "pipeline";
  options.dtype = at::kFloat;
  sample::SampleRequest request;
  request.prompt = "a red square";
  request.settings.width = 64;
  request.settings.height = 48;
  request.settings.num_inference_steps = 3;
  request.settings.seed = 11;
  const at::Tensor on_cpu = train::run_text_to_image(options, {request}).at(0);
  options.device = kCuda;
  const at::Tensor on_gpu = train::run_text_to_image(options, {request}).at(0);
  ASSERT_EQ(on_gpu.sizes(), on_cpu.sizes());
  EXPECT_TRUE(on_gpu.device().is_cpu());  // pictures come back to the host
  // uint8 pictures: float32 on two devices may round a level apart, rarely two.
  EXPECT_LE(max_abs_diff(on_gpu, on_cpu), 2.0);
}

TEST(GpuTrainer, TrainsOnTheDeviceWithOffloadAndTheLossFalls) {
  testing::TempDir dir("remat_gpu_trainer");
  testing::make_flux_tiny_dataset(dir / "data", 16);
  std::vector<std::string> warnings;
  const auto config = train::load_train_config(
      {"--model_family=flux", "--model_flavour=flux-tiny", "--model_type=full", "--device=cuda",
       "--instance_data_dir=" + (dir / "data"), "--output_dir=" + (dir / "out"), "--train_batch_size=2",
       "--learning_rate=2e-3", "--lr_scheduler=constant", "--mixed_precision=no", "--max_train_steps=40",
       "--gradient_checkpointing_interval=2", "--gradient_checkpointing_backend=unsloth", "--seed=3",
       "--checkpointing_steps=0"},
      warnings);
  const auto result = train::run_training(config, testing::quiet_hooks());
  ASSERT_EQ(result.records.size(), 40u);
  double head = 0, tail = 0;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(std::isfinite(result.records[i].loss));
    head += result.records[i].loss / 10;
    tail += result.records[30 + i].loss / 10;
  }
  std::printf("cuda: loss first 10 steps %.4f, last 10 steps %.4f\n", head, tail);
  EXPECT_LT(tail, 0.8 * head);
}

TEST(GpuDistributed, NcclGroupOfOneSumsOnTheDevice) {
  distributed::LaunchEnvironment env;
  env.master_port = testing::free_port();
  env.timeout = std::chrono::seconds(60);
  const auto group = distributed::ProcessGroup::connect(env, distributed::choose_backend("auto", kCuda));
  EXPECT_EQ(group->backend(), distributed::Backend::nccl);
  const at::Tensor values = torch::arange(8, torch::TensorOptions().dtype(at::kFloat).device(kCuda));
  std::vector<at::Tensor> tensors{values.clone()};
  group->all_reduce_sum(tensors, "the GPU test's sum");
  torch::cuda::synchronize();
  EXPECT_EQ(max_abs_diff(tensors[0], values), 0.0);  // one rank: the sum is the tensor itself
  group->barrier("the GPU test's barrier");
}

}  // namespace gpu_test
}  // namespace
}  // namespace remat
