#pragma once
/// \file
/// LoRA on remat::models::Linear layers with PEFT's module matching (check_target_module_exists in
/// peft's src/peft/tuners/tuners_utils.py) and file key names (the `transformer.` prefix of
/// diffusers' FluxLoraLoaderMixin.save_lora_weights).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include "remat/export.h"

namespace remat::models {

/// One Linear layer of a model: its qualified module name and its shape.
struct LinearShape {
  std::string name;          ///< e.g. "transformer_blocks.0.attn.to_q"
  int64_t in_features = 0;
  int64_t out_features = 0;
};

/// The parameters apply_lora would add with `rank` on the layers of `layers` matching
/// `target_suffixes` (rank x (in + out) per matched layer), without building anything: the
/// trainable size of a LoRA run for memory admission. Throws c10::ValueError for rank < 1 or a
/// count past int64.
REMAT_API int64_t lora_parameter_count(const std::vector<LinearShape>& layers,
                                       const std::vector<std::string>& target_suffixes, int64_t rank);

/// PEFT's target matching: `name` equals `suffix` or ends with "." + suffix.
REMAT_API bool lora_target_matches(const std::string& name, const std::string& suffix);

/// Freezes every parameter of `module` (requires_grad false), then enables LoRA (rank, alpha) on
/// each remat::models::Linear whose qualified name matches one of `target_suffixes`, leaving only
/// the LoRA factors trainable. Returns the wrapped module names in registration order. Throws
/// c10::ValueError when no module matches (as PEFT does) and for rank < 1 or alpha <= 0.
REMAT_API std::vector<std::string> apply_lora(torch::nn::Module& module,
                                              const std::vector<std::string>& target_suffixes,
                                              int64_t rank, double alpha);

/// SimpleTuner's Flux target suffix lists, by preset: "default", "all", "context",
/// "context+ffs", "all+ffs", "all+ffs+embedder", "ai-toolkit", "tiny", "nano" (SimpleTuner's
/// Flux.get_lora_target_layers in simpletuner/helpers/models/flux/model.py;
/// the fused to_qkv / add_qkv_proj names are omitted, these models have no fused projections).
/// Throws c10::ValueError naming the valid presets otherwise.
REMAT_API std::vector<std::string> flux_lora_target_modules(const std::string& preset);
/// The Flux preset names, in the order above.
REMAT_API std::vector<std::string> flux_lora_target_preset_names();
/// MageFlow's target suffix list (SimpleTuner's MageFlow.DEFAULT_LORA_TARGET in
/// simpletuner/helpers/models/mageflow/model.py): preset "default" only.
REMAT_API std::vector<std::string> mageflow_lora_target_modules(const std::string& preset);

/// The LoRA factors in PEFT file format: {"transformer.<path>.lora_A.weight": (r, in),
/// "transformer.<path>.lora_B.weight": (out, r), ...}. The tensors are the live parameters (not
/// copies); detach / clone before mutating.
REMAT_API std::map<std::string, at::Tensor> lora_state_dict(const torch::nn::Module& module);

/// The trainable LoRA parameters of `module` (every lora_A / lora_B weight).
REMAT_API std::vector<at::Tensor> lora_parameters(const torch::nn::Module& module);

}  // namespace remat::models
