#pragma once
/// \file
/// The Flux LoRA file formats people share, read into one form and applied to a model: PEFT /
/// diffusers (what remat writes), kohya / sd-scripts (`lora_unet_double_blocks_0_img_attn_qkv.
/// lora_down.weight` with `.alpha`), Black Forest Labs' control-LoRA layout and XLabs'
/// (diffusers' FluxLoraLoaderMixin.lora_state_dict in src/diffusers/loaders/lora_pipeline.py and
/// the converters of loaders/lora_conversion_utils.py; docs/WEIGHT_FORMATS.md). The key mapping
/// between Black Forest Labs' names and diffusers' is one table
/// (remat/models/flux_weight_formats.h).

#include <map>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include "remat/export.h"

namespace remat::models {

enum class LoraFileFormat { peft, kohya, bfl, xlabs };

/// "peft", "kohya", "bfl", "xlabs".
REMAT_API std::string lora_format_name(LoraFileFormat format);

/// One adapted Linear layer: delta W = scale * up @ down.
struct LoraModuleWeights {
  at::Tensor down;     ///< lora_A (r, in_features), float32
  at::Tensor up;       ///< lora_B (out_features, r), float32
  double scale = 1.0;  ///< alpha / r (1 where the format bakes alpha into the factors)
};

/// A LoRA file in diffusers module names.
struct LoraFile {
  std::string path;
  LoraFileFormat format = LoraFileFormat::peft;
  /// By diffusers module name without the "transformer." prefix
  /// ("transformer_blocks.0.attn.to_q"); fused source layers (qkv, linear1) are already split.
  std::map<std::string, LoraModuleWeights> modules;
  /// Whole tensors that replace the model's (BFL control LoRAs carry the query/key RMSNorm scales),
  /// by diffusers parameter name ("transformer_blocks.0.attn.norm_q.weight"); float32.
  std::map<std::string, at::Tensor> replaced_weights;
  /// Things dropped with a reason (dora_scale keys, text-encoder LoRA parts), for the log.
  std::vector<std::string> warnings;
};

/// Reads the LoRA at `path` (safetensors), detecting its format as diffusers' lora_state_dict
/// does, and converts it to diffusers module names. Throws c10::ValueError naming the file and
/// the first key no format recognises.
REMAT_API LoraFile read_lora_file(const std::string& path);

/// Adds user_scale * scale * up @ down to the weight of every module of `lora` in `model`
/// (computed in float32, rounded once to the weight's dtype); user_scale 0 leaves every weight
/// bit-for-bit unchanged. lora.replaced_weights are copied in when user_scale != 0 (diffusers
/// replaces them whatever the scale; remat keeps scale 0 the untouched base model). Checks everything first and changes nothing on error: a module the
/// model does not have, or factors whose shapes do not fit it, is a c10::ValueError naming the
/// file, the module and both shapes ("a LoRA for another model shape").
REMAT_API void merge_lora(torch::nn::Module& model, const LoraFile& lora, double user_scale);

/// Writes a trained LoRA in kohya's Flux form (lora_unet_<BFL name>.lora_down.weight /
/// .lora_up.weight / .alpha), for tools that read only that. `peft_state_dict` is
/// remat::models::lora_state_dict's output ("transformer.<module>.lora_A.weight" ...), `alpha`
/// the adapter's lora_alpha. Separate q, k, v (and proj_mlp) adapters of one fused BFL layer are
/// written as one block-diagonal adapter of rank n r with alpha n alpha, so read_lora_file gives
/// the same deltas back. Atomic like every remat writer.
REMAT_API void save_lora_kohya(const std::string& path, const std::map<std::string, at::Tensor>& peft_state_dict,
                               double alpha, const std::map<std::string, std::string>& metadata = {});

}  // namespace remat::models
