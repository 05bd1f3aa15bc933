// Memory admission (remat/train/admission.h): predicted weights, gradients and optimizer state
// against the device's available memory, before anything is allocated.
#include "remat/train/admission.h"

#include "remat/memory.h"
#include "remat/models/lora.h"
#include "remat/train/config.h"
#include "remat/train/family.h"

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
  if (d.trainable > 0) {
    out += ", gradients " + memory::format_bytes(d.gradient_bytes) + ", AdamW state " +
           memory::format_bytes(d.optimizer_bytes);
  }
  return out + ")";
}

}  // namespace

std::optional<MemoryDemand> predict_model_memory(const TransformerSpec& spec, const ModelUse& use) {
  const ModelFamily& family = model_family(spec.family);
  if (!family.parameter_count || (use.lora_rank > 0 && !family.linear_layers)) return std::nullopt;
  TransformerSpec resolved = spec;
  if (resolved.preset.empty()) resolved.preset = family.small_flavour;  // as make_transformer does
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
  d.gradient_bytes = d.trainable * 4;
  d.optimizer_bytes = d.trainable * 8;
  return d;
}

void admit_model(const TransformerSpec& spec, const ModelUse& use, const c10::Device& device,
                 std::optional<int64_t> available_bytes) {
  const auto demand = predict_model_memory(spec, use);
  if (!demand) return;
  const int64_t available = available_bytes ? *available_bytes : memory::available_bytes(device);
  if (demand->total() <= available) return;

  const ModelFamily& family = model_family(spec.family);
  const std::string flavour = spec.config_json ? "the model of " + *spec.config_json
                                               : spec.preset.empty() ? family.small_flavour : spec.preset;
  std::string fits;
  const auto suggest = [&](const std::string& option, const TransformerSpec& s, const ModelUse& u) {
    const auto d = predict_model_memory(s, u);
    if (d && d->total() <= available) fits += (fits.empty() ? "" : ", ") + option + " (" + memory::format_bytes(d->total()) + ")";
  };
  if (use.training && use.lora_rank == 0 && !use.lora_flag.empty()) {
    ModelUse lora = use;
    lora.lora_rank = TrainConfig{}.lora_rank;
    lora.lora_target = family.lora_target_presets.front();
    suggest(use.lora_flag, spec, lora);
  }
  for (const auto& other : family.flavours) {
    if (!spec.config_json && other == flavour) continue;
    TransformerSpec smaller = spec;
    smaller.preset = other;
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
