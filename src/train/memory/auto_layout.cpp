// The auto checkpoint layout: a measured model of one training step (Note [Whole-step model] in
// src/core/plan/cost_model.cpp) and the budget planner on it.
//
// Note [Step profile]
// The blocks are measured one per stack with Transformer::block_probes + profile_block. The rest
// of the step is measured in one real forward and backward of the model, through the stage
// observer (the blocks' input state "blocks_begin", their output "blocks_end") and gradient hooks
// on those states, which fire when the backward has finished the part after the blocks (hook on
// the output) and the blocks themselves (hook on the input). Only differences inside those
// windows are taken, so no figure depends on the layout the profiling step runs (per-block
// recompute, to keep its own peak low), and no total of any layout is used to calibrate:
//   fixed_bytes          live at "blocks_begin" less the blocks' input state;
//   tail_peak_bytes      peak from "blocks_end" until the output's gradient exists, above the live
//                        bytes at "blocks_end";
//   tail_backward_bytes  live when that gradient exists less live at "blocks_end" less g_N;
//   fixed_peak_bytes     the larger of the peak before "blocks_begin", the peak after the input's
//                        gradient exists (embedders' backward), and the live bytes after the
//                        backward plus the optimizer step's temporaries, measured by stepping a
//                        scratch optimizer of the same kind on a copy of the largest parameter (its
//                        temporaries are per parameter and freed before the next one).
// Before a first step the optimizer state does not exist yet: its bytes (optimizer_state_bytes:
// AdamW 2 per parameter byte, 3 with amsgrad; AdamWBF16 three bf16 buffers; Lion 1) are added to
// fixed_bytes and fixed_peak_bytes.
#include "remat/util/generator_guard.h"
#include "remat/train/memory/auto_layout.h"
#include "remat/util/error.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <stdexcept>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include "remat/memory.h"
#include "remat/autocast.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/optimizers/zero_optimizer.h"

namespace remat::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t tensor_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0;
}

// What the stage observer and the gradient hooks record (Note [Step profile]).
struct Marks {
  c10::Device device{c10::kCPU};
  Clock::time_point begin, end, tail_done, head_backward;
  int64_t head_forward_peak = 0, begin_live = 0, input_bytes = 0;
  bool input_requires_grad = false;
  int64_t end_live = 0;
  bool tail_finished = false;
  int64_t tail_peak = 0, tail_done_live = 0;
  bool head_backward_started = false;
};

void observe(const std::shared_ptr<Marks>& marks, const std::string& stage, const Tensors& state) {
  const c10::Device device = marks->device;
  synchronize_device(device);
  if (stage == "blocks_begin") {
    marks->head_forward_peak = memory::peak_bytes(device);
    marks->begin_live = memory::current_bytes(device);
    marks->input_bytes = storage_bytes(state);
    marks->begin = Clock::now();
    for (const auto& t : state) {
      if (!t.defined() || !t.requires_grad()) continue;
      marks->input_requires_grad = true;
      std::weak_ptr<Marks> weak = marks;
      t.register_hook([weak](at::Tensor) {
        auto m = weak.lock();
        if (!m || m->head_backward_started) return;
        synchronize_device(m->device);
        m->head_backward_started = true;
        m->head_backward = Clock::now();
        memory::reset_peak();
      });
    }
  } else if (stage == "blocks_end") {
    marks->end_live = memory::current_bytes(device);
    marks->end = Clock::now();
    memory::reset_peak();
    for (const auto& t : state) {
      if (!t.defined() || !t.requires_grad()) continue;
      std::weak_ptr<Marks> weak = marks;
      t.register_hook([weak](at::Tensor) {
        auto m = weak.lock();
        if (!m || m->tail_finished) return;
        synchronize_device(m->device);
        m->tail_finished = true;
        m->tail_peak = memory::peak_bytes(m->device);
        m->tail_done_live = memory::current_bytes(m->device);
        m->tail_done = Clock::now();
      });
      break;  // one hook: the gradient of the whole output
    }
  }
}

// Profiles one block per stack; `first_without_grad` also profiles the first block with an input
// that does not require grad (frozen embedders), as the real chain's block 0 runs.
struct StackCosts {
  std::vector<BlockCost> per_stack;  // one per non-empty stack, in order
  std::optional<BlockCost> first;
};

StackCosts profile_blocks(Transformer& model, const Batch& batch, const StepSettings& settings,
                          std::optional<Backend> ffn, bool first_without_grad,
                          const ProfileOptions& base) {
  const c10::Device device = batch.latents.device();
  AutocastGuard autocast(AutocastSnapshot::with(settings.autocast, device));
  StackCosts out;
  const auto probes = model.block_probes(batch, ffn);
  for (size_t i = 0; i < probes.size(); ++i) {
    const auto& probe = probes[i];
    ProfileOptions options = base;
    options.parameters = probe.parameters;
    out.per_stack.push_back(profile_block(probe.run, 0, probe.state, probe.kind, options));
    if (i == 0 && first_without_grad) {
      Tensors frozen;
      for (const auto& t : probe.state) frozen.push_back(t.defined() ? t.detach() : t);
      out.first = profile_block(probe.run, 0, frozen, probe.kind, options);
    }
    for (auto p : probe.parameters) p.mutable_grad().reset();
  }
  return out;
}

std::vector<BlockCost> chain_blocks(const StackCosts& costs, const std::vector<int64_t>& sizes) {
  std::vector<BlockCost> blocks;
  size_t probe = 0;
  for (int64_t size : sizes) {
    if (size == 0) continue;
    TORCH_INTERNAL_ASSERT(probe < costs.per_stack.size(), "[auto layout] fewer block probes than stacks");
    for (int64_t k = 0; k < size; ++k) blocks.push_back(costs.per_stack[probe]);
    ++probe;
  }
  if (costs.first && !blocks.empty()) blocks.front() = *costs.first;
  return blocks;
}

// Scratch optimizer step on a copy of the largest parameter: {temporaries above live, seconds}.
std::pair<int64_t, double> optimizer_temporaries(const torch::optim::Optimizer& optimizer,
                                                 const std::vector<at::Tensor>& parameters) {
  at::Tensor largest;
  for (const auto& p : parameters) {
    if (!largest.defined() || tensor_bytes(p) > tensor_bytes(largest)) largest = p;
  }
  if (!largest.defined()) return {0, 0.0};
  at::Tensor copy = largest.detach().clone().requires_grad_(true);
  copy.mutable_grad() = at::randn_like(copy);
  const auto scratch_optimizer = make_optimizer({copy}, optimizer_settings(optimizer));
  torch::optim::Optimizer& scratch = *scratch_optimizer;
  scratch.step();  // allocates the moments
  const c10::Device device = copy.device();
  synchronize_device(device);
  const int64_t before = memory::current_bytes(device);
  memory::reset_peak();
  const auto start = Clock::now();
  scratch.step();
  synchronize_device(device);
  const double step_s = seconds(start, Clock::now());
  return {std::max<int64_t>(0, memory::peak_bytes(device) - before), step_s};
}

}  // namespace

StepModel profile_step(Transformer& model, torch::optim::Optimizer& optimizer,
                       const std::vector<at::Tensor>& parameters, const Batch& batch,
                       const StepSettings& settings, const at::Generator& generator,
                       const StepProfileOptions& options) {
  TORCH_CHECK_VALUE(batch.latents.defined(), "[auto layout] the profiling batch has no latents");
  const c10::Device device = batch.latents.device();
  TORCH_CHECK(!device.is_cpu() || memory::cpu_tracking_installed(),
              "[auto layout] CPU memory tracking is not installed; call "
              "remat::memory::install_cpu_tracking() first thing in main()");
  const OptimizerSettings optimizer_kind = optimizer_settings(optimizer);  // one of make_optimizer's

  // The profile must not change the run: the global CPU generator and the device's (which
  // adamw_bf16's scratch step draws from) are restored however it ends; noise comes from a copy.
  const GlobalGeneratorGuard generators(device);
  at::Generator noise = generator.clone();

  StepModel out;
  out.stack_sizes = model.stack_sizes();
  const int64_t parameter_bytes = storage_bytes(parameters);
  if (!optimizer_has_state(optimizer)) {
    // ZeRO-1: this rank will hold the state of its own tensors only.
    const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer);
    out.missing_optimizer_state_bytes =
        optimizer_state_bytes(optimizer_kind, zero ? zero->owned_parameters() : parameters);
  }
  const int64_t missing = out.missing_optimizer_state_bytes;

  // One forward and backward with the stage observer (Note [Step profile]).
  auto marks = std::make_shared<Marks>();
  marks->device = device;
  model.set_stage_observer(
      [marks](const std::string& stage, const Tensors& state) { observe(marks, stage, state); });
  for (auto p : parameters) p.mutable_grad().reset();
  synchronize_device(device);
  memory::reset_peak();
  const auto start = Clock::now();
  try {
    // The training step's own forward and backward, without its update.
    TrainingStep step(model, optimizer, parameters, settings);
    step.forward_backward({batch}, noise);
  } catch (...) {
    model.set_stage_observer({});
    throw;
  }
  model.set_stage_observer({});
  synchronize_device(device);
  const auto backward_end = Clock::now();
  const int64_t head_backward_peak = marks->head_backward_started ? memory::peak_bytes(device) : 0;
  if (!marks->tail_finished) {  // nothing in the blocks trains: the backward never reached them
    marks->tail_peak = memory::peak_bytes(device);
    marks->tail_done_live = memory::current_bytes(device);
    marks->tail_done = backward_end;
  }
  const int64_t after_backward = memory::current_bytes(device);
  for (auto p : parameters) p.mutable_grad().reset();
  const auto [optimizer_extra, optimizer_largest_s] = optimizer_temporaries(optimizer, parameters);

  // The blocks.
  const StackCosts costs = profile_blocks(model, batch, settings, std::nullopt,
                                          !marks->input_requires_grad, options.blocks);
  Chain& chain = out.chain;
  chain.blocks = chain_blocks(costs, out.stack_sizes);
  TORCH_CHECK(!chain.blocks.empty(), "[auto layout] the model has no blocks to plan");
  int64_t offset = 0;
  for (size_t i = 0; i + 1 < out.stack_sizes.size(); ++i) {
    offset += out.stack_sizes[i];
    if (offset > 0 && offset < chain.num_blocks()) chain.forced_boundaries.push_back(offset);
  }
  const int64_t n = chain.num_blocks();
  const int64_t output_grad = chain.blocks.back().output_grad_bytes;
  chain.fixed_bytes = marks->begin_live - marks->input_bytes + missing;
  chain.tail_peak_bytes = std::max<int64_t>(0, marks->tail_peak - marks->end_live);
  chain.tail_backward_bytes = marks->tail_done_live - marks->end_live - output_grad;
  const int64_t head_forward = marks->head_forward_peak + missing;
  const int64_t head_backward = marks->head_backward_started ? head_backward_peak + missing : 0;
  const int64_t optimizer_peak = after_backward + missing + optimizer_extra;
  chain.fixed_peak_bytes = std::max({head_forward, head_backward, optimizer_peak});
  const double largest_bytes = [&] {
    int64_t b = 0;
    for (const auto& p : parameters) b = std::max(b, tensor_bytes(p));
    return static_cast<double>(std::max<int64_t>(b, 1));
  }();
  // The optimizer step is bound by memory traffic: its time scales with the bytes it updates.
  const double optimizer_s = optimizer_largest_s * static_cast<double>(parameter_bytes) / largest_bytes;
  chain.fixed_time_s = seconds(start, marks->begin) + seconds(marks->end, marks->tail_done) +
                       (marks->head_backward_started ? seconds(marks->head_backward, backward_end) : 0.0) +
                       optimizer_s;
  chain.offload_to_host = device.is_cuda();
  chain.checkpoint_overhead_bytes = checkpoint_overhead_bytes(device);
  if (options.gradients_persist) {
    for (auto& b : chain.blocks) {
      chain.fixed_bytes += b.parameter_grad_bytes;
      b.parameter_grad_bytes = 0;
    }
  }
  for (const auto& b : chain.blocks) out.block_forward_s.push_back(b.forward_s);
  (void)n;

  if (options.ffn) {
    const StackCosts ffn_costs = profile_blocks(model, batch, settings, Backend::Recompute,
                                                !marks->input_requires_grad, options.blocks);
    Chain ffn = chain;
    ffn.blocks = chain_blocks(ffn_costs, out.stack_sizes);
    if (options.gradients_persist) {
      for (auto& b : ffn.blocks) b.parameter_grad_bytes = 0;
    }
    out.ffn_chain = ffn;
  }
  return out;
}

Layout join_stack_layouts(const std::vector<Layout>& stacks) {
  Layout joined;
  int64_t offset = 0;
  for (const auto& stack : stacks) {
    for (const auto& s : stack.segments) joined.segments.push_back({s.begin + offset, s.end + offset, s.mode});
    offset += stack.num_blocks();
  }
  return joined;
}

std::vector<Layout> split_stack_layout(const Layout& layout, const std::vector<int64_t>& stack_sizes) {
  int64_t total = 0;
  for (int64_t size : stack_sizes) total += size;
  validate_layout(layout, total);
  std::vector<Layout> stacks(stack_sizes.size());
  int64_t begin = 0;
  for (size_t i = 0; i < stack_sizes.size(); ++i) {
    const int64_t end = begin + stack_sizes[i];
    for (const auto& s : layout.segments) {
      const int64_t a = std::max(s.begin, begin), b = std::min(s.end, end);
      if (a >= b) continue;
      if (s.mode != BlockMode::Keep && (s.begin < begin || s.end > end)) {
        throw_value_error("[auto layout] checkpointed segment " +
                                    std::string(block_mode_name(s.mode)) + "[" + std::to_string(s.begin) +
                                    "-" + std::to_string(s.end - 1) + "] must lie in one block stack, " +
                                    "blocks [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
      }
      stacks[i].segments.push_back({a - begin, b - begin, s.mode});
    }
    begin = end;
  }
  return stacks;
}

AutoLayout plan_auto_layout(const StepModel& model, int64_t budget_bytes, bool allow_offload, int64_t stream_from) {
  TORCH_CHECK_VALUE(budget_bytes > 0, "[train] gradient_checkpointing_memory_budget must be > 0 bytes, got ",
                    budget_bytes);
  PlannerOptions options;
  options.allow_offload = allow_offload;
  options.stream_from = stream_from;
  AutoLayout out;
  out.plan = plan_layout(model.chain, budget_bytes, options);
  if (!out.plan.fits) {
    throw NoLayoutFits(
        "[train] gradient_checkpointing_memory_budget must be at least " +
        memory::format_bytes(out.plan.min_possible_peak) + " (the smallest predicted peak of any " +
        "checkpoint layout for this model and these shapes), got " + memory::format_bytes(budget_bytes) +
        ": " + out.plan.explanation);
  }
  out.stack_layouts = split_stack_layout(out.plan.layout, model.stack_sizes);
  return out;
}

int64_t default_memory_budget(const c10::Device& device) { return memory::available_bytes(device); }

AutoLayout apply_auto_layout(Transformer& model, torch::optim::Optimizer& optimizer,
                             const std::vector<at::Tensor>& parameters, const Batch& batch,
                             const StepSettings& settings, const at::Generator& generator,
                             std::optional<int64_t> budget_bytes,
                             const std::function<void(const std::string&)>& log,
                             const StepProfileOptions& options) {
  // The profiling step's own layout: per-block recompute.
  model.set_checkpoint_plan(CheckpointPlan::simpletuner(true, std::nullopt, std::nullopt, "torch"));
  const StepModel step = profile_step(model, optimizer, parameters, batch, settings, generator, options);
  const c10::Device device = batch.latents.device();
  const int64_t budget = budget_bytes.value_or(default_memory_budget(device));
  // Streamed blocks (block swap) are checkpointed one per segment: the ring stays at two slots.
  const models::BlockSwap* swap = model.block_swap();
  const int64_t stream_from = swap != nullptr && swap->count() > 0 ? swap->first() : std::numeric_limits<int64_t>::max();
  AutoLayout chosen = plan_auto_layout(step, budget, /*allow_offload=*/true, stream_from);
  model.set_checkpoint_plan(CheckpointPlan::from_layouts(chosen.stack_layouts));
  if (log) log("[train] gradient_checkpointing_interval " + describe_plan(chosen.plan));
  return chosen;
}

}  // namespace remat::train
