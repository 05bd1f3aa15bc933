// Measuring one block's BlockCost. The measurements mirror the rules of Note [Checkpoint memory
// timeline] (src/core/plan/cost_model.cpp) so that a chain of profiled blocks predicts what a real
// step allocates:
// - the block's input is a tensor only the profiler (and whatever the block saves) holds, so
//   dropping it after forward frees exactly the part the block does not retain; the leaf it is
//   cloned from receives the input gradient, as the previous block would;
// - the output gradient enters the block as a tensor only autograd holds (the backward of a
//   scale by 1), so it is consumed and freed as in a chain; the caller's own gradient tensor is
//   live throughout and so part of the baseline.
#include "remat/profile.h"
#include "remat/util/error.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <unordered_set>

#include <ATen/Context.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "remat/memory.h"
#include "remat/stats.h"

namespace remat {
namespace {

void synchronize(const c10::Device& device) {
  if (device.is_cpu()) return;
  c10::impl::VirtualGuardImpl impl(device.type());
  impl.getStream(device).synchronize();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t grad_bytes(const Tensors& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (t.defined() && t.requires_grad()) bytes += static_cast<int64_t>(t.numel() * t.element_size());
  }
  return bytes;
}

// Bytes of the storages of `outputs` that are also storages of `inputs` (state passed through).
int64_t shared_bytes(const Tensors& inputs, const Tensors& outputs) {
  std::unordered_set<const void*> in;
  for (const auto& t : inputs) {
    if (t.defined()) in.insert(t.storage().unsafeGetStorageImpl());
  }
  Tensors shared;
  for (const auto& t : outputs) {
    if (t.defined() && in.count(t.storage().unsafeGetStorageImpl()) > 0) shared.push_back(t);
  }
  return storage_bytes(shared);
}

// One forward and backward; see the comment at the top of the file.
BlockCost measure_once(const SegmentFn& block, const Tensors& state, const c10::Device& device,
                       const std::vector<at::Tensor>& parameters) {
  BlockCost c;
  for (auto p : parameters) p.mutable_grad().reset();  // as after zero_grad(set_to_none)
  Tensors leaves(state.size()), input(state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& t = state[i];
    if (!t.defined()) continue;
    if (t.requires_grad()) {
      leaves[i] = t.detach().clone().requires_grad_(true);
      input[i] = leaves[i].clone();
    } else {
      input[i] = t.detach().clone();
    }
  }
  c.boundary_bytes = storage_bytes(input);
  c.boundary_grad_bytes = grad_bytes(input);

  synchronize(device);
  const int64_t before = memory::current_bytes(device);
  memory::reset_peak();
  auto start = std::chrono::steady_clock::now();
  Tensors output = block(input);
  synchronize(device);
  c.forward_s = seconds_since(start);
  c.forward_peak_bytes = std::max<int64_t>(0, memory::peak_bytes(device) - before);
  TORCH_CHECK(output.size() == input.size(), "[profile_block] the block returned ", output.size(),
              " state tensors, expected ", input.size());
  c.output_bytes = storage_bytes(output);
  c.output_grad_bytes = grad_bytes(output);

  const int64_t passed_through = shared_bytes(input, output);
  const int64_t with_input = memory::current_bytes(device);
  input.clear();
  const int64_t after = memory::current_bytes(device);
  c.retained_input_bytes =
      std::clamp<int64_t>(c.boundary_bytes - passed_through - (with_input - after), 0, c.boundary_bytes);
  c.activation_bytes = std::max<int64_t>(
      0, after - before + c.boundary_bytes - c.output_bytes - c.retained_input_bytes);

  Tensors roots, root_grads;
  for (const auto& t : output) {
    if (!t.defined() || !t.requires_grad()) continue;
    roots.push_back(t * 1.0);
    root_grads.push_back(at::randn_like(t));
  }
  // The model assumes a block's graph does not keep its own output (true of residual blocks,
  // which end in an addition). One that does keeps those bytes until its backward: count them as
  // activations, which over-predicts by at most output_bytes while the next block holds them too.
  const int64_t with_output = memory::current_bytes(device);
  output.clear();
  const int64_t output_freed = with_output - memory::current_bytes(device);
  c.activation_bytes +=
      std::clamp<int64_t>(c.output_bytes - passed_through - output_freed, 0, c.output_bytes);
  if (roots.empty()) return c;
  synchronize(device);
  const int64_t before_backward = memory::current_bytes(device);
  memory::reset_peak();
  start = std::chrono::steady_clock::now();
  torch::autograd::backward(roots, root_grads);
  synchronize(device);
  c.backward_s = seconds_since(start);
  // The scale's backward made the block's incoming gradient (output_grad_bytes) first; the block's
  // own peak is measured on top of it, as the chain has it live when the block's backward starts.
  c.backward_peak_bytes = std::max<int64_t>(
      0, memory::peak_bytes(device) - before_backward - c.output_grad_bytes);
  Tensors grads;
  for (const auto& p : parameters) grads.push_back(p.grad());
  c.parameter_grad_bytes = storage_bytes(grads);
  return c;
}

}  // namespace

int64_t storage_bytes(const Tensors& tensors) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) {
      bytes += static_cast<int64_t>(t.storage().nbytes());
    }
  }
  return bytes;
}

int64_t checkpoint_overhead_bytes(c10::Device device) {
  if (!device.is_cpu()) return 0;
  auto generator = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
  std::lock_guard<std::mutex> lock(generator.mutex());
  return storage_bytes({generator.get_state()});
}

BlockCost profile_block(const SegmentFn& block, const Tensors& state, const std::string& kind,
                        const ProfileOptions& options) {
  if (!block) throw_value_error("[profile_block] block must be callable, got an empty function");
  if (options.warmup < 0) {
    throw_value_error("[profile_block] warmup must be >= 0, got " +
                                std::to_string(options.warmup));
  }
  if (options.repeats < 1) {
    throw_value_error("[profile_block] repeats must be >= 1, got " +
                                std::to_string(options.repeats));
  }
  const auto first = std::find_if(state.begin(), state.end(), [](const at::Tensor& t) { return t.defined(); });
  if (first == state.end()) {
    throw_value_error("[profile_block] state must hold at least one defined tensor, got " +
                                std::to_string(state.size()) + " undefined");
  }
  const c10::Device device = first->device();
  TORCH_CHECK(!device.is_cpu() || memory::cpu_tracking_installed(),
              "[profile_block] CPU memory tracking is not installed; call "
              "remat::memory::install_cpu_tracking() first thing in main()");

  torch::autograd::AutoGradMode grad_on(true);
  std::vector<double> forward_s, backward_s;
  BlockCost cost;
  for (int run = 0; run < options.warmup + options.repeats; ++run) {
    const BlockCost c = measure_once(block, state, device, options.parameters);
    if (run < options.warmup) continue;
    forward_s.push_back(c.forward_s);
    backward_s.push_back(c.backward_s);
    cost.boundary_bytes = c.boundary_bytes;
    cost.boundary_grad_bytes = c.boundary_grad_bytes;
    cost.output_bytes = c.output_bytes;
    cost.output_grad_bytes = c.output_grad_bytes;
    cost.activation_bytes = std::max(cost.activation_bytes, c.activation_bytes);
    cost.retained_input_bytes = std::max(cost.retained_input_bytes, c.retained_input_bytes);
    cost.forward_peak_bytes = std::max(cost.forward_peak_bytes, c.forward_peak_bytes);
    cost.backward_peak_bytes = std::max(cost.backward_peak_bytes, c.backward_peak_bytes);
    cost.parameter_grad_bytes = std::max(cost.parameter_grad_bytes, c.parameter_grad_bytes);
  }
  cost.kind = kind;
  cost.forward_s = median(forward_s);
  cost.backward_s = median(backward_s);
  return cost;
}

BlockCost profile_block(const RunBlock& run_block, int64_t block_index, const Tensors& state,
                        const std::string& kind, const ProfileOptions& options) {
  if (!run_block) {
    throw_value_error("[profile_block] run_block must be callable, got an empty function");
  }
  return profile_block([&run_block, block_index](const Tensors& s) { return run_block(block_index, s); },
                       state, kind, options);
}

}  // namespace remat
