#pragma once
/// \file
/// Black Forest Labs' single-file Flux.1 transformer layout (`double_blocks.N.img_attn.qkv.weight`,
/// `single_blocks.N.linear1.weight`, `final_layer.adaLN_modulation.1.weight` ...) next to diffusers'
/// (diffusers' convert_flux_transformer_checkpoint_to_diffusers in
/// src/diffusers/loaders/single_file_utils.py; docs/WEIGHT_FORMATS.md).
///
/// The mapping between the two is written down once, as the pattern table returned by
/// flux_bfl_module_patterns(). Everything else is derived from it: the per-tensor table for one
/// FluxConfig (the streaming loader and the BFL writer), the name lookups of the kohya / BFL LoRA
/// formats (remat/models/lora_formats.h) and the table in docs/WEIGHT_FORMATS.md (rendered by
/// render_flux_bfl_table_markdown and compared with the doc by a test).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "remat/export.h"
#include "remat/io/safetensors.h"
#include "remat/models/flux.h"

namespace remat::models {

/// Where a BFL module sits: once in the model, once per double-stream block, once per
/// single-stream block.
enum class BflScope { global, double_block, single_block };

/// What kind of module a row maps: a Linear (`.weight` + `.bias`) or an RMSNorm (BFL `.scale`,
/// diffusers `.weight`).
enum class BflModuleKind { linear, rms_norm };

/// One row of the table, with `{i}` standing for the block index in both names.
struct BflModulePattern {
  BflScope scope = BflScope::global;
  BflModuleKind kind = BflModuleKind::linear;
  std::string bfl;                     ///< "double_blocks.{i}.img_attn.qkv"
  std::vector<std::string> diffusers;  ///< "transformer_blocks.{i}.attn.to_q", ... in row order
  /// Output rows of each diffusers target in units of the hidden size (qkv: 1,1,1; linear1:
  /// 1,1,1,4); empty for a one-to-one row (the whole tensor, any size).
  std::vector<int64_t> split_units;
  /// BFL stores (shift, scale) rows, diffusers (scale, shift): the two halves of dim 0 swap.
  bool swap_halves = false;
  /// Present only in guidance-distilled models (config.guidance_embeds).
  bool guidance_only = false;
};

/// The table (rendered in docs/WEIGHT_FORMATS.md, "The key table"), in BFL file order.
REMAT_API const std::vector<BflModulePattern>& flux_bfl_module_patterns();

/// One BFL module of a concrete model: the pattern with the block index filled in and the split
/// sizes in rows.
struct BflModule {
  const BflModulePattern* pattern = nullptr;
  std::string bfl;                     ///< "double_blocks.3.img_attn.qkv"
  std::vector<std::string> diffusers;  ///< "transformer_blocks.3.attn.to_q", ...
  std::vector<int64_t> split_rows;     ///< rows per diffusers target; empty for one-to-one
};

/// One tensor of a BFL file and the diffusers parameters it fills.
struct BflTensor {
  std::string bfl_key;                      ///< "double_blocks.3.img_attn.qkv.weight"
  std::vector<std::string> diffusers_keys;  ///< "transformer_blocks.3.attn.to_q.weight", ...
  std::vector<int64_t> split_rows;          ///< rows per target along dim 0; empty: one-to-one
  bool swap_halves = false;
};

/// Every BFL module of a Flux model with `config` (its block counts, hidden size and guidance
/// embedder), in BFL file order.
REMAT_API std::vector<BflModule> flux_bfl_modules(const FluxConfig& config);
/// Every BFL tensor key of a Flux model with `config` and its diffusers parameters.
REMAT_API std::vector<BflTensor> flux_bfl_tensors(const FluxConfig& config);

/// The BFL module named `bfl_module` ("double_blocks.3.img_attn.qkv"), or, with `underscored`,
/// the same name with every '.' written as '_' (kohya's "double_blocks_3_img_attn_qkv"). The split
/// rows are derived from `fused_rows` (the output rows of the whole BFL module, needed for fused
/// rows only; 0 leaves split_rows empty). nullopt when no row of the table matches.
REMAT_API std::optional<BflModule> find_bfl_module(const std::string& bfl_module, bool underscored,
                                                   int64_t fused_rows = 0);

/// The BFL module that holds diffusers Linear `diffusers_module` ("transformer_blocks.3.attn.to_k")
/// and the position of that module among its targets; nullopt when none does.
struct BflModuleSlot {
  BflModule module;  ///< split_rows left empty
  size_t part = 0;   ///< index into module.diffusers
};
REMAT_API std::optional<BflModuleSlot> find_bfl_module_of(const std::string& diffusers_module);

/// The table as a Markdown table, for docs/WEIGHT_FORMATS.md (split sizes shown for flux-dev).
REMAT_API std::string render_flux_bfl_table_markdown();

enum class FluxWeightLayout { diffusers, bfl };

/// The layout of a transformer file, from its keys.
struct FluxWeightLayoutInfo {
  FluxWeightLayout layout = FluxWeightLayout::diffusers;
  /// What precedes the BFL names ("" or "model.diffusion_model.").
  std::string prefix;
};

/// BFL when `img_in.weight` or `double_blocks.0.img_attn.norm.key_norm.scale` is present, bare
/// or under `model.diffusion_model.` (diffusers' check, generalised to models without double
/// blocks); diffusers otherwise.
REMAT_API FluxWeightLayoutInfo detect_flux_weight_layout(const std::vector<std::string>& keys);

/// Whether `safetensors_file` is a regular file holding a BFL-layout Flux transformer.
/// False for folders and for anything that is not a readable safetensors file.
REMAT_API bool is_bfl_flux_file(const std::string& safetensors_file);

/// The FluxConfig of a BFL file, from its shapes (for files without a config.json): block counts
/// from the highest `double_blocks.N` / `single_blocks.N` index, hidden size, input and output
/// channels and text widths from img_in / final_layer.linear / txt_in / vector_in, the head size
/// from the query norm, guidance from `guidance_in`. axes_dims_rope cannot be read from weights:
/// it is taken from the preset with the same head size (flux-dev 128, flux-small 64, flux-tiny 32),
/// otherwise c10::ValueError asks for a config.json.
REMAT_API FluxConfig flux_config_from_bfl(const io::SafetensorsFile& file);

/// Loads a Flux transformer strictly from `files` (one file, or the shards of one checkpoint), in
/// either layout. Diffusers layout: io::load_state_dict_into. BFL layout: streams tensor by tensor
/// from the mapping, copying the rows of each fused tensor straight into the diffusers
/// parameters (converted to their dtype), so no second copy of the model is held. Every key is
/// checked before anything is copied: a missing BFL key, a key the table does not consume, a
/// shape that does not fit or a non-float tensor is a c10::ValueError naming the file and key;
/// the model is then untouched. The model's LoRA factors, if any, are not loaded.
REMAT_API void load_flux_weights(FluxImpl& model, const std::vector<io::SafetensorsFile>& files);
/// Same for one .safetensors file. (A component folder: remat/models/flux_transformer_weights.h.)
REMAT_API void load_flux_weights(FluxImpl& model, const std::string& safetensors_file);

/// Writes `model` (without its LoRA factors) in the BFL layout, keys without prefix, in its
/// parameters' dtype; atomic (temporary file + rename). Fused tensors (qkv, linear1) and the
/// swapped final modulation are copies, the others are written from the parameters.
REMAT_API void save_flux_bfl(const std::string& path, const FluxImpl& model,
                             const std::map<std::string, std::string>& metadata = {});

}  // namespace remat::models
