// `remat plan` (remat/train/memory/training_plan.h): the memory model of a training step from the
// config alone, and one planner over checkpointing, activation offload and block swap on it.
//
// Note [Plan memory model]
// The step profiler (profile_step, remat/train/memory/auto_layout.h) measures a built model: the
// bytes every block keeps, its forward and backward peaks, what the rest of the step holds. A
// 12-billion-parameter model cannot be built to be measured, so narrow copies of it stand in: the
// same architecture with h = 1, 2, 3, 4 heads of the real head size (two blocks per stack: the
// first block of a chain, whose input needs no gradient, differs from the rest), random weights,
// and image and text tokens in proportion to the width (h / H of the run's). Along that line every
// tensor of a step has a size that is a polynomial in h of degree at most 3: activations are
// tokens x width (h^2), weight-sized tensors width x width (h^2: a quantised Linear's dequantised
// weight, the bfloat16 copies autocast makes of float32 weights, which a Linear keeps for its
// input's gradient), attention statistics heads x tokens (h^2), the score matrices LibTorch 1.13
// materialises heads x tokens^2 (h^3), LoRA activations tokens x rank (h), modulations width (h).
// So is every sum of them, and the cubic through the four proxies' figures gives each at h = H.
// Keeping the tokens in proportion keeps the proxies in the real model's regime (weights against
// activations): the moment a block peaks depends on it, and a peak is a maximum over moments, a
// polynomial only while the same moment wins. tests/train/memory/training_plan_test.cpp checks the
// extension against a direct profile of a model twice as wide as the widest proxy: kept bytes
// within 1 %, peaks within 2 % under and 12 % over.
//
// What the proxies, with their two blocks a stack, cannot show is taken from the config: weights
// (as stored: float32, int8 or NF4 and scales), their gradients and optimizer state (admission's MemoryDemand, the
// same figures `remat train` admits a run with), each block's parameter gradients (created in its
// backward: the trainable parameters of its Linears, x 4 bytes), and the optimizer step's
// temporaries (two float32 copies of the largest trainable tensor: AdamW's denominator and
// update). The proxies are built as the trainer builds the model (quantised as base_model_precision
// says): a quantised Linear's dequantised weight, a width-squared temporary, is in their peaks.
//
// Times are modelled, not measured: a CPU's seconds say nothing of a GPU's. Each block's forward
// is its FLOPs (PlanProxy::block_forward_flops) at the stated device throughput, its backward
// twice that. A streamed block's weights cross to the device before its forward and before its
// recomputation; each copy overlaps the computation of the block before it in that pass (the
// copy stream prefetches one block ahead, remat/weight_stream.h), and what it does not hide is
// added to the step.
//
// The attention offload (gradient_checkpointing_offload_attention) is a second profile of the
// same proxies with the offload on: on the CPU the offloaded tensors leave the tracked bytes, so
// that profile's chain is what the device would hold. Each block's attention bytes (its kept
// bytes without the offload less those with it) cross to the host after its forward (hidden
// behind the forward that goes on) and back when its backward needs them (exposed: no prefetch
// is planned), whether the block is kept or recomputed, so the offload adds a constant to every
// layout's step time and the planner weighs it against recomputation and block swap.
#include "remat/train/memory/training_plan.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <numeric>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "remat/byte_size.h"
#include "remat/memory.h"
#include "remat/models/lora.h"
#include "remat/models/quantization.h"
#include "remat/train/family/family.h"
#include "remat/train/family/hub_models.h"
#include "remat/train/family/model_source.h"
#include "remat/train/memory/admission.h"
#include "remat/train/memory/auto_layout.h"
#include "remat/train/memory/base_precision.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/options/config.h"
#include "remat/util/error.h"

namespace remat::train {
namespace {

int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  int64_t out = 0;
  for (const auto& t : tensors) out += static_cast<int64_t>(t.numel() * t.element_size());
  return out;
}

// One proxy's profile and what it holds besides activations.
struct ProxyProfile {
  StepModel step;
  int64_t weight_bytes = 0;      // as admission counts them (predict_model_memory)
  int64_t trainable_bytes = 0;   // float32 parameters that train (their gradients' size)
  std::vector<int64_t> block_trainable_bytes;  // per chain block
};

ModelUse model_use_of(const TransformerSpec& spec, const TrainingPlanRequest& request, int64_t blocks_to_swap) {
  ModelUse use;
  use.training = true;
  use.lora_rank = request.lora_rank;
  use.lora_target = request.lora_target;
  use.base_precision = spec.base_precision;
  use.blocks_to_swap = blocks_to_swap;
  use.swap_ring_slots = 2;  // streamed blocks are checkpointed one per segment
  return use;
}

MemoryDemand demand_of(const TransformerSpec& spec, const TrainingPlanRequest& request, int64_t blocks_to_swap) {
  const auto demand = predict_model_memory(spec, model_use_of(spec, request, blocks_to_swap));
  TORCH_CHECK_VALUE(demand.has_value(), "[plan] model_family ", spec.family,
                    " gives no parameter count from its config: it cannot be planned");
  return *demand;
}

// Built as the trainer builds it (float32, quantised as base_model_precision says, LoRA applied).
ProxyProfile profile_proxy(const TransformerSpec& spec, const TrainingPlanRequest& request, bool attention_offload) {
  const c10::Device cpu(c10::kCPU);
  auto model = make_transformer(spec, cpu);
  const ModelFamily& family = model_family(spec.family);
  if (request.lora_rank > 0) {
    model->apply_lora(request.lora_target, request.lora_rank, static_cast<double>(request.lora_rank));
  }
  model->module().train();
  std::vector<at::Tensor> parameters;
  for (const auto& [name, p] : model->trainable_parameters()) parameters.push_back(p);
  TORCH_CHECK_VALUE(!parameters.empty(), "[plan] the model has no trainable parameters");
  ProxyProfile out;
  // Weights as admission counts them, the same figure the real model's fixed bytes take.
  out.weight_bytes = demand_of(spec, request, 0).weight_bytes;
  out.trainable_bytes = bytes_of(parameters);
  // Trainable bytes per block, by the block stacks' module names.
  for (size_t s = 0; s < family.checkpointing.block_stack_modules.size(); ++s) {
    const std::string prefix = family.checkpointing.block_stack_modules[s] + ".";
    std::vector<int64_t> per_block;
    for (const auto& item : model->module().named_parameters()) {
      const std::string& name = item.key();
      const at::Tensor& p = item.value();
      if (!p.requires_grad() || name.rfind(prefix, 0) != 0) continue;
      const auto k = static_cast<size_t>(std::stoll(name.substr(prefix.size())));
      if (per_block.size() <= k) per_block.resize(k + 1, 0);
      per_block[k] += static_cast<int64_t>(p.numel() * p.element_size());
    }
    out.block_trainable_bytes.insert(out.block_trainable_bytes.end(), per_block.begin(), per_block.end());
  }

  OptimizerSettings optimizer_settings;
  const auto optimizer = make_optimizer(parameters, optimizer_settings);
  at::Generator generator = at::detail::createCPUGenerator(0);
  const Batch batch = model->synthetic_batch(request.batch, request.image_tokens, request.text_tokens, generator, cpu);
  StepSettings settings;
  if (request.bf16) settings.autocast = at::kBFloat16;
  model->set_checkpoint_plan(CheckpointPlan::simpletuner(true, std::nullopt, std::nullopt, "torch"));
  if (attention_offload) model->set_attention_offload(SavedTensorOffload{});
  StepProfileOptions options;
  options.blocks.warmup = 1;
  options.blocks.repeats = 1;  // memory figures are exact on the first measured run; times are not used
  out.step = profile_step(*model, *optimizer, parameters, batch, settings, generator, options);
  return out;
}

// Heads of the proxies (Note [Plan memory model]).
constexpr std::array<int64_t, 4> kProxyHeads = {1, 2, 3, 4};
using ProxyProfiles = std::array<ProxyProfile, kProxyHeads.size()>;

// The value at `heads` of the cubic through v[i] at kProxyHeads[i] = i + 1 (Lagrange's form;
// each weight is an integer for an integer h: a product of consecutive integers divides).
int64_t extend(const std::array<int64_t, 4>& v, int64_t heads) {
  const int64_t h = heads;
  return -v[0] * ((h - 2) * (h - 3) * (h - 4) / 6) + v[1] * ((h - 1) * ((h - 3) * (h - 4) / 2)) -
         v[2] * ((h - 4) * ((h - 1) * (h - 2) / 2)) + v[3] * ((h - 1) * (h - 2) * (h - 3) / 6);
}

// A field of the proxies' profiles, extended.
template <typename Get>
int64_t extend_field(const ProxyProfiles& proxies, int64_t heads, Get get) {
  return extend({get(proxies[0]), get(proxies[1]), get(proxies[2]), get(proxies[3])}, heads);
}

// Every figure of a block, parameter gradients included (a LoRA's are linear in the width, a full
// fine-tune's quadratic; the norms' constant), extended.
BlockCost extend_block(const ProxyProfiles& proxies, size_t block, int64_t heads) {
  const auto field = [&](int64_t BlockCost::*member) {
    return extend_field(proxies, heads, [&](const ProxyProfile& p) { return p.step.chain.blocks[block].*member; });
  };
  BlockCost c = proxies.back().step.chain.blocks[block];
  for (int64_t BlockCost::*member :
       {&BlockCost::activation_bytes, &BlockCost::retained_input_bytes, &BlockCost::boundary_bytes,
        &BlockCost::boundary_grad_bytes, &BlockCost::output_bytes, &BlockCost::output_grad_bytes,
        &BlockCost::forward_peak_bytes, &BlockCost::backward_peak_bytes, &BlockCost::parameter_grad_bytes}) {
    c.*member = field(member);
  }
  return c;
}

// The largest trainable tensor of the real model in float32: what the optimizer step's
// temporaries are sized by.
int64_t largest_trainable_bytes(const TransformerSpec& spec, const TrainingPlanRequest& request) {
  const ModelFamily& family = model_family(spec.family);
  const std::vector<std::string> targets =
      request.lora_rank > 0 ? family.lora_target_modules(request.lora_target) : std::vector<std::string>{};
  int64_t largest = 0;
  for (const auto& layer : family.linear_layers(spec)) {
    if (request.lora_rank == 0) {
      largest = std::max(largest, layer.in_features * layer.out_features * 4);
      continue;
    }
    for (const auto& t : targets) {
      if (models::lora_target_matches(layer.name, t)) {
        largest = std::max(largest, request.lora_rank * std::max(layer.in_features, layer.out_features) * 4);
      }
    }
  }
  return largest;
}


// The real model's chain from the proxies' profiles (Note [Plan memory model]); sets the fixed
// bytes besides weights, gradients and optimizer state in `other_fixed_bytes`.
Chain chain_of(const ProxyProfiles& proxies, const PlanProxy& shape, const TransformerSpec& spec,
               const TrainingPlanRequest& request, int64_t* other_fixed_bytes) {
  Chain chain;
  const int64_t heads = shape.heads;
  size_t proxy_offset = 0;
  size_t real_index = 0;
  for (size_t s = 0; s < shape.stack_sizes.size(); ++s) {
    const int64_t in_proxy = std::min<int64_t>(shape.stack_sizes[s], 2);
    for (int64_t k = 0; k < shape.stack_sizes[s]; ++k, ++real_index) {
      const size_t p = proxy_offset + static_cast<size_t>(std::min<int64_t>(k, in_proxy - 1));
      BlockCost cost = extend_block(proxies, p, heads);
      cost.forward_s = request.batch *
                       shape.block_forward_flops(s, request.image_tokens, request.text_tokens) / request.device_flops;
      cost.backward_s = 2.0 * cost.forward_s;
      chain.blocks.push_back(cost);
    }
    proxy_offset += static_cast<size_t>(in_proxy);
    if (s + 1 < shape.stack_sizes.size() && real_index > 0) {
      chain.forced_boundaries.push_back(static_cast<int64_t>(real_index));
    }
  }
  // The proxies' fixed bytes less their weights and optimizer state: inputs, position tables.
  const auto other = [](const ProxyProfile& p) {
    return p.step.chain.fixed_bytes - p.weight_bytes - p.step.missing_optimizer_state_bytes;
  };
  // Their fixed peaks less weights, optimizer state, every gradient and the proxy's own
  // optimizer temporaries (bounded by the trainable bytes): what the embedders and head add.
  const auto other_peak = [](const ProxyProfile& p) {
    return p.step.chain.fixed_peak_bytes - p.weight_bytes - p.step.missing_optimizer_state_bytes - p.trainable_bytes;
  };
  const MemoryDemand demand = demand_of(spec, request, 0);
  *other_fixed_bytes = std::max<int64_t>(0, extend_field(proxies, heads, other));
  // A quantised base's dequantised Linear is inside the proxies' measured peaks.
  chain.fixed_bytes = *other_fixed_bytes + demand.total() - demand.gradient_bytes - demand.dequantized_transient_bytes;
  const int64_t optimizer_temporaries = 2 * largest_trainable_bytes(spec, request);
  chain.fixed_peak_bytes = std::max<int64_t>(0, extend_field(proxies, heads, other_peak)) +
                           demand.total() - demand.dequantized_transient_bytes + optimizer_temporaries;
  chain.tail_peak_bytes = std::max<int64_t>(
      0, extend_field(proxies, heads, [](const ProxyProfile& p) { return p.step.chain.tail_peak_bytes; }));
  // Gradients of trainable parameters outside the blocks (embedders, head) are live while the
  // blocks' backward runs: the part of all gradients the blocks do not hold.
  // The proxies' figure holds their own such gradients: taken out, the real ones added.
  const auto outside_blocks = [](const ProxyProfile& p) {
    int64_t in_blocks = 0;
    for (int64_t v : p.block_trainable_bytes) in_blocks += v;
    return p.step.chain.tail_backward_bytes - (p.trainable_bytes - in_blocks);
  };
  int64_t block_gradients = 0;
  for (const auto& b : chain.blocks) block_gradients += b.parameter_grad_bytes;
  chain.tail_backward_bytes = extend_field(proxies, heads, outside_blocks) +
                              std::max<int64_t>(0, demand.gradient_bytes - block_gradients);
  chain.offload_to_host = request.device.is_cuda();
  chain.host_bandwidth_bytes_per_s = request.host_bandwidth;
  chain.checkpoint_overhead_bytes = request.device.is_cuda() ? 0 : checkpoint_overhead_bytes(request.device);
  validate_chain(chain);
  return chain;
}

// The chain `base` of a plan with `swapped` blocks streamed: the device holds the ring, not their
// weights.
Chain chain_with_swap(const Chain& base, const TrainingPlanRequest& request, int64_t swapped) {
  Chain chain = base;
  const MemoryDemand with = demand_of(request.spec, request, swapped), without = demand_of(request.spec, request, 0);
  // Weights (and a full fine-tune's optimizer state) of the streamed blocks leave the step's fixed
  // bytes, which hold no gradients (the blocks' own count them); the fixed peak (after the
  // backward, the optimizer step) loses their gradients too.
  chain.fixed_bytes -= (without.weight_bytes + without.optimizer_bytes) - (with.weight_bytes + with.optimizer_bytes);
  chain.fixed_peak_bytes -= without.total() - with.total();
  // A full fine-tune's streamed block's weight gradients leave the device when the backward uses
  // the block before it (its release): their creation stays in its own backward peak, and they
  // are not live for the rest of the step.
  if (with.swapped_training_bytes > 0) {
    for (int64_t b = chain.num_blocks() - swapped; b < chain.num_blocks(); ++b) {
      chain.blocks[static_cast<size_t>(b)].parameter_grad_bytes = 0;
    }
  }
  return chain;
}

// Weight copies the computation does not hide (Note [Plan memory model]).
double exposed_copy_seconds(const StepMemoryModel& model, const TrainingPlanRequest& request, int64_t swapped) {
  const auto& blocks = model.chain.blocks;
  const auto n = static_cast<int64_t>(blocks.size());
  double exposed = 0.0;
  for (int64_t b = n - swapped; b < n; ++b) {
    const double copy = static_cast<double>(model.block_weight_bytes[static_cast<size_t>(b)]) / request.host_bandwidth;
    // Forward: behind the previous block's forward, when that one was streamed too (the stream
    // prefetches from the first streamed block's use on).
    const double forward_cover = b > n - swapped ? blocks[static_cast<size_t>(b - 1)].forward_s : 0.0;
    exposed += std::max(0.0, copy - forward_cover);
    // Backward: behind the recomputation and backward of the block after it; the last block is
    // still resident when the backward starts.
    if (b + 1 < n) {
      const auto& next = blocks[static_cast<size_t>(b + 1)];
      exposed += std::max(0.0, copy - (next.forward_s + next.backward_s));
    }
  }
  return exposed;
}

// Host bytes of the attention offload at their most: every kept block's until the backward
// reaches it, and the largest recomputed segment's while it is recomputed.
int64_t attention_host_bytes(const StepMemoryModel& model, const Layout& layout) {
  int64_t kept = 0, largest_segment = 0;
  for (const auto& s : layout.segments) {
    int64_t bytes = 0;
    for (int64_t b = s.begin; b < s.end; ++b) bytes += model.block_attention_bytes[static_cast<size_t>(b)];
    if (s.mode == BlockMode::Keep) {
      kept += bytes;
    } else {
      largest_segment = std::max(largest_segment, bytes);
    }
  }
  return kept + largest_segment;
}

int64_t offloaded_bytes(const Chain& chain, const Layout& layout) {
  int64_t out = 0;
  if (!chain.offload_to_host) return 0;
  for (const auto& s : layout.segments) {
    if (s.mode == BlockMode::Offload) out += chain.blocks[static_cast<size_t>(s.begin)].boundary_bytes;
  }
  return out;
}

std::vector<PlanGroup> group_blocks(const Layout& layout, const StepMemoryModel& model, int64_t stream_from) {
  std::vector<PlanGroup> groups;
  std::vector<int64_t> stack_of;
  for (size_t s = 0; s < model.stack_sizes.size(); ++s) {
    for (int64_t k = 0; k < model.stack_sizes[s]; ++k) stack_of.push_back(static_cast<int64_t>(s));
  }
  for (const auto& seg : layout.segments) {
    for (int64_t b = seg.begin; b < seg.end; ++b) {
      const auto& name = model.stack_names[static_cast<size_t>(stack_of[static_cast<size_t>(b)])];
      const int64_t per = seg.mode == BlockMode::Keep ? 1 : seg.end - seg.begin;
      const bool streamed = b >= stream_from;
      if (!groups.empty()) {
        PlanGroup& g = groups.back();
        if (g.stack == name && g.mode == seg.mode && g.blocks_per_segment == per && g.streamed == streamed &&
            g.last + 1 == b) {
          g.last = b;
          continue;
        }
      }
      groups.push_back({name, b, b, seg.mode, per, streamed});
    }
  }
  return groups;
}

// The checkpoint layout as remat train options: a uniform interval when every segment is one,
// else the budget planner's own choice at this budget (interval auto).
std::string options_of(const TrainingPlan& plan, const TrainingPlanRequest& request) {
  std::string out;
  int64_t interval = -1;
  bool uniform = true, offload = false, keep = false;
  for (const auto& s : plan.layout.segments) {
    if (s.mode == BlockMode::Keep) {
      keep = true;
      continue;
    }
    offload = offload || s.mode == BlockMode::Offload;
    const int64_t length = s.end - s.begin;
    if (interval < 0) interval = length;
    uniform = uniform && length == interval;
  }
  if (interval < 0) {
    out = "--gradient_checkpointing=false";
  } else if (uniform && !keep && !offload) {
    out = "--gradient_checkpointing_interval=" + std::to_string(interval);
  } else {
    out = "--gradient_checkpointing_interval=auto --gradient_checkpointing_memory_budget=" +
          format_byte_size(request.budget_bytes);
    if (offload) out += " --gradient_checkpointing_backend=unsloth";
  }
  if (plan.blocks_to_swap > 0) out += " --musubi_blocks_to_swap=" + std::to_string(plan.blocks_to_swap);
  if (plan.attention_offload) out += " --gradient_checkpointing_offload_attention=true";
  return out;
}

}  // namespace

StepModel profile_step_for_plan(const TransformerSpec& spec, const TrainingPlanRequest& request) {
  return profile_proxy(spec, request, request.attention_offload.value_or(false)).step;
}

int64_t image_tokens_for_resolution(const TrainConfig& config) {
  // One image token per pixel_multiple x pixel_multiple pixels (Flux: 8x VAE downsampling, then
  // 2x2 packing; MageFlow: 16x, one token per latent pixel). `resolution` is a side in pixels,
  // or megapixels when below 16 (SimpleTuner's area mode).
  const double side = config.resolution < 16 ? std::sqrt(config.resolution * 1e6) : config.resolution;
  const auto pixels_per_token = static_cast<double>(model_family(config.model_family).encoders.pixel_multiple);
  const int64_t per_side = std::max<int64_t>(1, static_cast<int64_t>(std::lround(side / pixels_per_token)));
  return per_side * per_side;
}

TransformerSpec planned_spec_of(const TrainConfig& config, bool* read_model_files) {
  TransformerSpec spec;
  spec.family = config.model_family;
  spec.flavour = config.model_flavour;
  spec.base_precision = base_precision_of(config);
  // The model's shapes as training reads them: a hub id from the local cache, a folder or a
  // config.json; when the model files are not on this machine, pretrained_transformer_config or
  // the flavour's shapes stand in.
  TrainConfig resolved = config;
  try {
    resolve_hub_models(resolved);
  } catch (const std::exception&) {
    resolved = config;
  }
  bool read = true;
  try {
    spec.config_json = resolve_model_source(resolved).config_json;
  } catch (const std::exception&) {
    spec.config_json = config.pretrained_transformer_config;
    read = false;
  }
  if (read_model_files != nullptr) *read_model_files = read;
  return spec;
}

TrainingPlanRequest plan_request_of(const TrainConfig& config, int64_t budget_bytes,
                                    std::optional<int64_t> host_budget_bytes) {
  const ModelFamily& family = model_family(config.model_family);
  TrainingPlanRequest r;
  r.spec = planned_spec_of(config);
  if (config.model_type == "lora") {
    r.lora_rank = config.lora_rank;
    r.lora_target = family.lora_target(config);
  }
  r.batch = config.train_batch_size;
  r.image_tokens = image_tokens_for_resolution(config);
  r.text_tokens = config.tokenizer_max_length;
  r.bf16 = config.mixed_precision == "bf16";
  r.device = config.device == "cpu" ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA);
  r.budget_bytes = budget_bytes;
  r.host_budget_bytes = host_budget_bytes;
  if (config.musubi_blocks_to_swap > 0) r.blocks_to_swap = config.musubi_blocks_to_swap;
  if (config.gradient_checkpointing_offload_attention) r.attention_offload = true;
  r.allow_offload = true;
  return r;
}

StepMemoryModel build_step_memory_model(const TrainingPlanRequest& request) {
  const ModelFamily& family = model_family(request.spec.family);
  if (!family.plan_proxy || !family.linear_layers || !family.parameter_count) {
    std::string planned;
    for (const auto& name : model_family_names()) {
      if (model_family(name).plan_proxy) planned += (planned.empty() ? "" : ", ") + name;
    }
    throw_value_error("[plan] model_family " + request.spec.family +
                      " has no memory model for planning without its weights; families that have one: " + planned);
  }
  TORCH_CHECK_VALUE(request.batch >= 1 && request.image_tokens >= 1 && request.text_tokens >= 1,
                    "[plan] batch, image and text tokens must be >= 1, got ", request.batch, ", ",
                    request.image_tokens, ", ", request.text_tokens);
  TransformerSpec spec = request.spec;
  if (spec.flavour.empty() && !spec.config_json) spec.flavour = family.small_flavour;
  const PlanProxy shape = family.plan_proxy(spec);
  TORCH_CHECK_VALUE(shape.heads >= 1 && !shape.stack_sizes.empty(), "[plan] the model has no attention heads or blocks");
  // The attention offload is profiled when the request sets it, or leaves it to the planner on a
  // GPU (on the CPU nothing leaves the process's memory, so the planner never chooses it there).
  const bool with_attention_offload = request.attention_offload.value_or(request.device.is_cuda());

  const auto start = std::chrono::steady_clock::now();
  ProxyProfiles proxies, offloaded;
  for (size_t i = 0; i < kProxyHeads.size(); ++i) {
    // Tokens in proportion to the width (Note [Plan memory model]).
    const auto scaled = [&](int64_t tokens) {
      return std::max<int64_t>(1, (tokens * kProxyHeads[i] + shape.heads / 2) / shape.heads);
    };
    TrainingPlanRequest at_width = request;
    at_width.image_tokens = scaled(request.image_tokens);
    at_width.text_tokens = scaled(request.text_tokens);
    proxies[i] = profile_proxy(shape.proxy(kProxyHeads[i], 2), at_width, /*attention_offload=*/false);
    if (with_attention_offload) {
      offloaded[i] = profile_proxy(shape.proxy(kProxyHeads[i], 2), at_width, /*attention_offload=*/true);
    }
  }
  StepMemoryModel out;
  out.profile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.stack_sizes = shape.stack_sizes;
  out.stack_names = family.checkpointing.stacks;
  out.block_weight_bytes = block_weight_bytes(spec, model_use_of(spec, request, 0));
  TORCH_CHECK(static_cast<int64_t>(out.block_weight_bytes.size()) ==
                  std::accumulate(shape.stack_sizes.begin(), shape.stack_sizes.end(), int64_t{0}),
              "[plan] the family's Linear layers do not cover its blocks");
  out.chain = chain_of(proxies, shape, spec, request, &out.other_fixed_bytes);
  if (with_attention_offload) {
    int64_t other_fixed = 0;
    Chain chain = chain_of(offloaded, shape, spec, request, &other_fixed);
    for (size_t b = 0; b < chain.blocks.size(); ++b) {
      out.block_attention_bytes.push_back(
          std::max<int64_t>(0, out.chain.blocks[b].activation_bytes - chain.blocks[b].activation_bytes));
    }
    out.attention_offloaded_chain = std::move(chain);
  }
  return out;
}

TrainingPlan plan_training(const StepMemoryModel& model, const TrainingPlanRequest& request) {
  TORCH_CHECK_VALUE(request.budget_bytes > 0, "[plan] the budget must be more than 0 bytes, got ",
                    request.budget_bytes);
  const int64_t n = model.chain.num_blocks();
  // Swap counts to try: the user's (clamped as SimpleTuner's MusubiBlockSwapManager.build does),
  // or every count.
  std::vector<int64_t> counts;
  if (request.blocks_to_swap) {
    counts.push_back(std::min(*request.blocks_to_swap, n - 1));
  } else {
    for (int64_t k = 0; k < n; ++k) counts.push_back(k);
  }

  // With and without the attention offload, as the request allows (Note [Plan memory model]).
  std::vector<bool> attention;
  if (request.attention_offload.value_or(true) && model.attention_offloaded_chain) attention.push_back(true);
  if (!request.attention_offload.value_or(false)) attention.push_back(false);
  TORCH_CHECK_VALUE(!attention.empty(), "[plan] the request sets gradient_checkpointing_offload_attention, and the "
                                        "model was built without its profile");
  double attention_copy_s = 0.0;
  for (int64_t bytes : model.block_attention_bytes) attention_copy_s += static_cast<double>(bytes) / request.host_bandwidth;

  TrainingPlan best, smallest;
  bool have_best = false, have_smallest = false;
  const double reference = predict(model.chain, layout_keep_all(n)).step_s;
  for (const bool attention_offload : attention) {
    for (const int64_t swapped : counts) {
      const Chain chain =
          chain_with_swap(attention_offload ? *model.attention_offloaded_chain : model.chain, request, swapped);
      for (const bool offload : {false, true}) {
        if (offload && !(request.allow_offload && chain.offload_to_host)) continue;
        PlannerOptions options;
        options.allow_offload = offload;
        options.stream_from = n - swapped;
        const PlanResult result = plan_layout(chain, request.budget_bytes, options);
        TrainingPlan plan;
        plan.budget_bytes = request.budget_bytes;
        plan.host_budget_bytes = request.host_budget_bytes;
        plan.layout = result.layout;
        plan.blocks_to_swap = swapped;
        plan.attention_offload = attention_offload;
        plan.peak_bytes = result.prediction.peak_bytes;
        const MemoryDemand demand = demand_of(request.spec, request, swapped);
        plan.host_weight_bytes = demand.swapped_weight_bytes;
        plan.ring_bytes = demand.swap_ring_bytes;
        plan.host_activation_bytes = offloaded_bytes(chain, result.layout);
        if (attention_offload) {
          plan.host_activation_bytes += attention_host_bytes(model, result.layout);
          plan.attention_copy_s = attention_copy_s;
        }
        plan.exposed_copy_s = exposed_copy_seconds(model, request, swapped);
        // A full fine-tune's streamed gradients go back synchronously (float32, the weights' size);
        // the optimizer's step on the host is not modelled.
        if (demand.swapped_training_bytes > 0) {
          plan.exposed_copy_s += static_cast<double>(demand.swapped_weight_bytes) / request.host_bandwidth;
        }
        plan.step_s = result.prediction.step_s + plan.exposed_copy_s + plan.attention_copy_s;
        plan.reference_step_s = reference;
        const bool host_fits = !request.host_budget_bytes ||
                               plan.host_weight_bytes + plan.host_activation_bytes <= *request.host_budget_bytes;
        plan.fits = result.fits && host_fits;
        if (host_fits && (!have_smallest || result.min_possible_peak < smallest.smallest_peak_bytes)) {
          smallest = plan;
          smallest.smallest_peak_bytes = result.min_possible_peak;
          have_smallest = true;
        }
        if (plan.fits && (!have_best || plan.step_s < best.step_s)) {
          best = plan;
          have_best = true;
        }
      }
    }
  }
  TrainingPlan out = have_best ? best : smallest;
  if (!have_best && !have_smallest) {  // every candidate over the host budget
    throw_value_error("[plan] nothing fits in a host budget of " + memory::format_bytes(*request.host_budget_bytes) +
                      ": even without streamed weights or offloaded activations the plan needs more");
  }
  out.groups = group_blocks(out.layout, model, n - out.blocks_to_swap);
  out.options = options_of(out, request);
  if (!have_best) {
    out.smallest_peak_bytes = smallest.smallest_peak_bytes;
    std::string layout;
    for (const auto& g : out.groups) {
      layout += (layout.empty() ? "" : " ") + std::string(block_mode_name(g.mode)) + "[" + std::to_string(g.first) +
                (g.last > g.first ? "-" + std::to_string(g.last) : "") +
                (g.mode != BlockMode::Keep && g.blocks_per_segment > 1 ? ", " + std::to_string(g.blocks_per_segment) + " per checkpoint" : "") + "]";
    }
    out.smallest_with = "the layout " + layout +
                        (out.blocks_to_swap > 0 ? " and musubi_blocks_to_swap " + std::to_string(out.blocks_to_swap) : "") +
                        (out.attention_offload ? " and gradient_checkpointing_offload_attention" : "");
  }
  return out;
}

std::string format_training_plan(const TrainingPlan& plan) {
  std::ostringstream out;
  for (const auto& g : plan.groups) {
    std::string what;
    switch (g.mode) {
      case BlockMode::Keep: what = "keep"; break;
      case BlockMode::Recompute: what = "recompute"; break;
      case BlockMode::Offload: what = "offload to host and recompute"; break;
    }
    if (g.mode != BlockMode::Keep) {
      what += g.blocks_per_segment == 1 ? ", one block per checkpoint"
                                        : ", " + std::to_string(g.blocks_per_segment) + " blocks per checkpoint";
    }
    if (g.streamed) what += "; weights streamed from host memory";
    const std::string range = g.first == g.last ? "block " + std::to_string(g.first)
                                                : "blocks " + std::to_string(g.first) + "-" + std::to_string(g.last);
    out << "  " << g.stack << ", " << range << ": " << what << "\n";
  }
  if (plan.attention_offload) {
    out << "  every block: attention activations in host memory, copied back when backward needs them\n";
  }
  out << "predicted device peak: " << memory::format_bytes(plan.peak_bytes) << " of "
      << memory::format_bytes(plan.budget_bytes) << " budget";
  if (plan.ring_bytes > 0) out << " (of which the weight ring " << memory::format_bytes(plan.ring_bytes) << ")";
  out << "\n";
  out << "host memory: " << memory::format_bytes(plan.host_weight_bytes) << " streamed weights (pinned), "
      << memory::format_bytes(plan.host_activation_bytes) << " offloaded activations";
  if (plan.host_budget_bytes) out << ", of " << memory::format_bytes(*plan.host_budget_bytes) << " budget";
  out << "\n";
  std::ostringstream factor;
  factor.setf(std::ios::fixed);
  factor.precision(2);
  factor << plan.step_factor();
  out << "step-time factor: " << factor.str() << " (against every block kept with its weights on the device";
  const auto share_of = [&plan](double seconds) {
    std::ostringstream share;
    share.setf(std::ios::fixed);
    share.precision(0);
    share << 100.0 * seconds / plan.step_s;
    return share.str();
  };
  if (plan.exposed_copy_s > 0.0) out << "; weight copies not hidden: " << share_of(plan.exposed_copy_s) << "% of the step";
  if (plan.attention_copy_s > 0.0) {
    out << "; attention activations copied back: " << share_of(plan.attention_copy_s) << "% of the step";
  }
  out << ")\n";
  out << "options: " << plan.options << "\n";
  return out.str();
}

}  // namespace remat::train
