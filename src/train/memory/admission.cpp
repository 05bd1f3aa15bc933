// Memory admission (remat/train/memory/admission.h): predicted weights, gradients and optimizer state
// against the device's available memory, before anything is allocated.
#include "remat/train/memory/admission.h"

#include <algorithm>

#include "remat/memory.h"
#include "remat/models/lora.h"
#include "remat/train/options/config.h"
#include "remat/train/family/family.h"
#include "remat/train/optimizers/zero_optimizer.h"

namespace remat::train {
namespace {

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string describe(const MemoryDemand& d) {
  std::string out = memory::format_bytes(d.total()) + " (weights " + memory::format_bytes(d.weight_bytes);
  if (d.quantized_linears > 0) {
    out += " with " + std::to_string(d.quantized_linears) + " Linears quantised to " +
           memory::format_bytes(d.quantized_weight_bytes) + ", one dequantised Linear " +
           memory::format_bytes(d.dequantized_transient_bytes);
  }
  if (d.trainable > 0) {
    out += ", gradients " + memory::format_bytes(d.gradient_bytes) + ", AdamW state " +
           memory::format_bytes(d.optimizer_bytes);
    if (d.optimizer_shards > 1) {
      out += " (ZeRO-1: this rank's shard of " + std::to_string(d.optimizer_shards) + "), weight broadcast " +
             memory::format_bytes(d.broadcast_bytes);
    }
  }
  if (d.ema_bytes > 0) out += ", EMA weights " + memory::format_bytes(d.ema_bytes);
  if (d.swapped_weight_bytes > 0) {
    out += "; block swap: " + memory::format_bytes(d.swapped_weight_bytes) + " of weights" +
           (d.swapped_training_bytes > 0 ? " and " + memory::format_bytes(d.swapped_training_bytes) +
                                               " of their gradients and AdamW state"
                                         : std::string()) +
           " in host memory, a ring of " + memory::format_bytes(d.swap_ring_bytes) + " on the device";
  }
  return out + ")";
}

}  // namespace

int64_t dequantized_bytes(int64_t elements, int64_t element_bytes) {
  // models::dequantize_weight computes in float32: the expanded codes and the scaled weight are
  // both alive until the cast to the layer's dtype (none for float32) is made.
  return elements * (2 * 4 + (element_bytes == 4 ? 0 : element_bytes));
}

bool ema_lives_on(const TrainConfig& config, const c10::Device& device) {
  return config.use_ema && (device.is_cpu() || (config.ema_device == "accelerator" && !config.ema_cpu_only));
}

namespace {

// The frozen Linear weights of each block, in run order: the stacks in `stacks` order, blocks by
// index ("<stack>.<k>.<...>", as Flux's transformer_blocks.3.attn.to_q).
std::vector<int64_t> block_linear_bytes(const std::vector<models::LinearShape>& layers,
                                        const std::vector<std::string>& stacks, const ModelUse& use) {
  std::vector<std::vector<int64_t>> per_stack(stacks.size());
  for (const auto& layer : layers) {
    for (size_t s = 0; s < stacks.size(); ++s) {
      const std::string prefix = stacks[s] + ".";
      if (layer.name.rfind(prefix, 0) != 0) continue;
      const auto k = static_cast<size_t>(std::stoll(layer.name.substr(prefix.size())));
      if (per_stack[s].size() <= k) per_stack[s].resize(k + 1, 0);
      const int64_t elements = layer.out_features * layer.in_features;
      const bool quantized = use.base_precision.mode != models::WeightQuantization::none &&
                             models::is_quantized_linear_name(layer.name);
      per_stack[s][k] += quantized
                             ? models::quantized_weight_bytes(layer.out_features, layer.in_features, use.base_precision)
                             : elements * use.weight_element_bytes;
      per_stack[s][k] += layer.out_features * use.weight_element_bytes;  // the bias
    }
  }
  std::vector<int64_t> blocks;
  for (const auto& stack : per_stack) blocks.insert(blocks.end(), stack.begin(), stack.end());
  return blocks;
}

// Block swap (remat/models/block_swap.h): the last N blocks' Linear weights leave the device for
// host memory; the ring that streams them comes in (the norms inside a block, a few KiB, are
// left on the device's side of the count).
void add_block_swap(MemoryDemand& d, const std::vector<models::LinearShape>& layers,
                    const std::vector<std::string>& stacks, const ModelUse& use) {
  const std::vector<int64_t> blocks = block_linear_bytes(layers, stacks, use);
  const auto n = static_cast<int64_t>(blocks.size());
  const int64_t swapped = std::min(use.blocks_to_swap, n - 1);
  int64_t largest = 0;
  for (int64_t b = n - swapped; b < n; ++b) {
    d.swapped_weight_bytes += blocks[static_cast<size_t>(b)];
    largest = std::max(largest, blocks[static_cast<size_t>(b)]);
  }
  d.swap_ring_bytes = largest * use.swap_ring_slots;
  d.weight_bytes += d.swap_ring_bytes - d.swapped_weight_bytes;
  if (use.training && use.lora_rank == 0) {
    // A full fine-tune's streamed blocks keep their gradients and optimizer state on the host; the
    // device holds one group's gradients from its backward until it is released.
    const int64_t swapped_parameters = d.swapped_weight_bytes / use.weight_element_bytes;
    d.swapped_training_bytes = swapped_parameters * (4 + 8);
    d.gradient_bytes -= swapped_parameters * 4 - largest / use.weight_element_bytes * 4;
    d.optimizer_bytes -= swapped_parameters * 8;
  }
}

}  // namespace

std::vector<int64_t> block_weight_bytes(const TransformerSpec& spec, const ModelUse& use) {
  const ModelFamily& family = model_family(spec.family);
  if (!family.linear_layers || family.checkpointing.block_stack_modules.empty()) return {};
  TransformerSpec resolved = spec;
  if (resolved.flavour.empty()) resolved.flavour = family.small_flavour;  // as make_transformer does
  return block_linear_bytes(family.linear_layers(resolved), family.checkpointing.block_stack_modules, use);
}

std::optional<MemoryDemand> predict_model_memory(const TransformerSpec& spec, const ModelUse& use) {
  const ModelFamily& family = model_family(spec.family);
  const bool quantized = use.base_precision.mode != models::WeightQuantization::none;
  if (!family.parameter_count || ((use.lora_rank > 0 || quantized) && !family.linear_layers)) return std::nullopt;
  TransformerSpec resolved = spec;
  if (resolved.flavour.empty()) resolved.flavour = family.small_flavour;  // as make_transformer does
  // Model configs are bounded (remat/models/config_limits.h): at most ~3e14 parameters, so the
  // byte counts below (x 16 at most) stay far inside int64.
  const int64_t base = family.parameter_count(resolved);
  const int64_t lora = use.lora_rank > 0 ? models::lora_parameter_count(family.linear_layers(resolved),
                                                                        family.lora_target_modules(use.lora_target),
                                                                        use.lora_rank)
                                         : 0;
  MemoryDemand d;
  d.parameters = base + lora;
  d.trainable = !use.training ? 0 : use.lora_rank > 0 ? lora : base;
  d.weight_bytes = d.parameters * use.weight_element_bytes;
  if (quantized) {
    // Each quantised Linear's weight leaves the full-size count and comes back at its quantised
    // size; its bias stays full (the same Linears make_transformer quantises).
    for (const auto& layer : family.linear_layers(resolved)) {
      if (!models::is_quantized_linear_name(layer.name)) continue;
      const int64_t elements = layer.out_features * layer.in_features;
      const int64_t bytes = models::quantized_weight_bytes(layer.out_features, layer.in_features, use.base_precision);
      d.weight_bytes += bytes - elements * use.weight_element_bytes;
      d.quantized_weight_bytes += bytes;
      d.quantized_linears += 1;
      d.dequantized_transient_bytes = std::max(d.dequantized_transient_bytes, dequantized_bytes(elements, use.weight_element_bytes));
    }
  }
  d.gradient_bytes = d.trainable * 4;
  d.optimizer_bytes = d.trainable * 8;
  d.ema_bytes = use.ema ? d.trainable * 4 : 0;
  if (use.blocks_to_swap > 0 && family.linear_layers && !family.checkpointing.block_stack_modules.empty()) {
    add_block_swap(d, family.linear_layers(resolved), family.checkpointing.block_stack_modules, use);
  }
  if (use.zero_stage == 1 && use.world_size > 1 && use.training && use.lora_rank == 0) {
    // The assignment ZeroRedundancyOptimizer makes, over the tensors the config names: the Linear
    // weights in registration order, then everything else (biases, norms) as one tensor.
    std::vector<int64_t> sizes;
    int64_t linear = 0;
    if (family.linear_layers) {
      for (const auto& layer : family.linear_layers(resolved)) {
        sizes.push_back(layer.in_features * layer.out_features);
        linear += sizes.back();
      }
    }
    sizes.push_back(std::max<int64_t>(0, base - linear));
    const auto per_rank = bytes_per_rank(sizes, assign_to_ranks(sizes, use.world_size), use.world_size);
    const int64_t largest = *std::max_element(per_rank.begin(), per_rank.end());
    d.optimizer_bytes = largest * 8;
    d.optimizer_shards = use.world_size;
    d.broadcast_bytes = std::min<int64_t>(ZeroRedundancyOptimizer::kDefaultBucketBytes, largest * 4);
  }
  return d;
}

std::optional<MemoryDemand> predict_rank_memory(const TransformerSpec& spec, ModelUse use, int world_size,
                                                int zero_stage) {
  TORCH_CHECK_VALUE(world_size >= 1, "[memory] world_size must be >= 1, got ", world_size);
  TORCH_CHECK_VALUE(zero_stage == 0 || zero_stage == 1, "[memory] zero_stage must be 0 or 1, got ", zero_stage);
  use.world_size = world_size;
  use.zero_stage = zero_stage;
  return predict_model_memory(spec, use);
}

void admit_model(const TransformerSpec& spec, const ModelUse& use, const c10::Device& device,
                 std::optional<int64_t> available_bytes) {
  const auto demand = predict_model_memory(spec, use);
  if (!demand) return;
  const int64_t available = available_bytes ? *available_bytes : memory::available_bytes(device);
  if (demand->total() <= available) return;

  const ModelFamily& family = model_family(spec.family);
  const std::string flavour = spec.config_json ? "the model of " + *spec.config_json
                                               : spec.flavour.empty() ? family.small_flavour : spec.flavour;
  std::string fits;
  const auto suggest = [&](const std::string& option, const TransformerSpec& s, const ModelUse& u) {
    const auto d = predict_model_memory(s, u);
    if (d && d->total() <= available) fits += (fits.empty() ? "" : ", ") + option + " (" + memory::format_bytes(d->total()) + ")";
  };
  // The quantised precisions first: they keep the model the user chose. Only for LoRA or
  // inference (a full fine-tune trains the weights a quantised base freezes); int8 before NF4,
  // which costs more accuracy.
  const bool can_quantize = !use.training || use.lora_rank > 0;
  if (!use.precision_flag.empty()) {
    for (const char* name : {"int8-quanto", "nf4-bnb"}) {
      const models::BasePrecision p = models::parse_base_model_precision(name);
      if (p.mode == use.base_precision.mode) continue;
      if (use.base_precision.mode == models::WeightQuantization::nf4) continue;  // already the smallest
      ModelUse quantized = use;
      quantized.base_precision = p;
      if (can_quantize) {
        suggest(use.precision_flag + "=" + name, spec, quantized);
      } else if (!use.lora_flag.empty()) {
        quantized.lora_rank = TrainConfig{}.lora_rank;
        quantized.lora_target = family.lora_target_presets.front();
        suggest(use.lora_flag + " " + use.precision_flag + "=" + name, spec, quantized);
      }
    }
  }
  if (use.training && use.lora_rank == 0 && !use.lora_flag.empty()) {
    ModelUse lora = use;
    lora.lora_rank = TrainConfig{}.lora_rank;
    lora.lora_target = family.lora_target_presets.front();
    suggest(use.lora_flag, spec, lora);
  }
  for (const auto& other : family.flavours) {
    if (!spec.config_json && other == flavour) continue;
    TransformerSpec smaller = spec;
    smaller.flavour = other;
    smaller.config_json.reset();
    suggest("--model_flavour=" + other, smaller, use);
  }
  const std::string what = use.training ? (use.lora_rank > 0 ? " LoRA training" : " full training") : "";
  throw ValidationError(
      "model_flavour", flavour,
      "[memory] " + flavour + " (" + with_commas(demand->parameters) + " parameters" +
          (demand->trainable > 0 ? ", " + with_commas(demand->trainable) + " trainable" : std::string()) + ")" +
          what + " needs " +
          describe(*demand) + ", but " + device.str() + " has " + memory::format_bytes(available) +
          " available. " + (fits.empty() ? "No smaller flavour of " + family.name + " fits" : "These would fit: " + fits) +
          "; or pass " + use.override_flag + " to build it anyway.");
}

}  // namespace remat::train
