#pragma once
/// \file
/// LoRA on remat::models::Linear layers with PEFT's module matching and file key names
/// (MODELS.md §1.13, §2.7).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include "remat/export.h"

namespace remat::models {

/// PEFT's target matching: `name` equals `suffix` or ends with "." + suffix.
REMAT_API bool lora_target_matches(const std::string& name, const std::string& suffix);

/// Freezes every parameter of `module` (requires_grad false), then enables LoRA (rank, alpha) on
/// each remat::models::Linear whose qualified name matches one of `target_suffixes`, leaving only
/// the LoRA factors trainable. Returns the wrapped module names in registration order. Throws
/// std::invalid_argument when no module matches (as PEFT does) and for rank < 1 or alpha <= 0.
REMAT_API std::vector<std::string> apply_lora(torch::nn::Module& module,
                                              const std::vector<std::string>& target_suffixes,
                                              int64_t rank, double alpha);

/// SimpleTuner's target suffix lists. family "flux": "default", "all", "context", "context+ffs",
/// "all+ffs", "all+ffs+embedder", "ai-toolkit", "tiny", "nano" (§1.13; the fused to_qkv /
/// add_qkv_proj names are omitted, these models have no fused projections). family "mageflow":
/// "default" (§2.7). Throws std::invalid_argument naming the valid values otherwise.
REMAT_API std::vector<std::string> lora_target_preset(const std::string& family,
                                                      const std::string& preset_name);
/// The preset names of a family, in the order above.
REMAT_API std::vector<std::string> lora_target_preset_names(const std::string& family);

/// The LoRA factors in PEFT file format: {"transformer.<path>.lora_A.weight": (r, in),
/// "transformer.<path>.lora_B.weight": (out, r), ...}. The tensors are the live parameters (not
/// copies); detach / clone before mutating.
REMAT_API std::map<std::string, at::Tensor> lora_state_dict(const torch::nn::Module& module);

/// The trainable LoRA parameters of `module` (every lora_A / lora_B weight).
REMAT_API std::vector<at::Tensor> lora_parameters(const torch::nn::Module& module);

}  // namespace remat::models
