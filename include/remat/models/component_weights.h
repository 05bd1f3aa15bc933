#pragma once
/// \file
/// The weights of one component directory of a diffusers pipeline folder (a transformer, a VAE, a
/// text encoder): finding them by the diffusers / transformers file names
/// (diffusers/models/modeling_utils.py, ModelMixin.from_pretrained; transformers/modeling_utils.py,
/// PreTrainedModel.from_pretrained), checking a shard index against its shards, loading them strictly
/// into a module and writing them sharded like the hub's writers. Every error is a c10::ValueError
/// starting with "[pipeline]" that names the file and, where one is at fault, the tensor key.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "remat/export.h"
#include "remat/io/safetensors.h"

namespace remat::models {

/// The weight files of one component directory, as the diffusers / transformers conventions
/// name them.
struct ComponentWeights {
  std::string directory;
  /// The base name: "diffusion_pytorch_model" (diffusers models) or "model" (transformers).
  std::string base;
  /// The index file (`<base>.safetensors.index.json`) of a sharded component; unset otherwise.
  std::optional<std::string> index;
  /// Full paths of the weight files: the one `<base>.safetensors`, or every shard the index
  /// names, sorted and each listed once.
  std::vector<std::string> files;
  /// Sharded: tensor key -> shard file name (as the index writes it). Empty when unsharded.
  std::map<std::string, std::string> weight_map;
};

/// Finds the weights of `component_dir`: `diffusion_pytorch_model.safetensors.index.json` or
/// `diffusion_pytorch_model.safetensors` (diffusers), or `model.safetensors.index.json` or
/// `model.safetensors` (transformers); an index wins over the whole file of the same name, as in
/// diffusers' from_pretrained, and files of both names at once are ambiguous (an error). Reads and checks the index (remat/util/bounded_json.h
/// bounds; an object with a `weight_map` object of key -> plain file name in the same directory).
/// Throws naming the directory and what was expected when there is none or more than one, when
/// only another variant's files (`*.fp16.safetensors` ...) or pickle files (`*.bin`, never read:
/// pickles can run code) exist, or when the index is malformed. Does not open the shards.
///
/// `variant` (diffusers' and transformers' `variant=` of from_pretrained, SimpleTuner's --variant):
/// non-empty, the variant's files are read instead, `<base>.<variant>.safetensors` or
/// `<base>.safetensors.index.<variant>.json` (the shards are those the index names); a directory
/// without them is an error naming the variant, the names expected and the files present.
REMAT_API ComponentWeights find_component_weights(const std::string& component_dir, const std::string& variant = {});

/// Throws c10::ValueError unless `variant` is a weights variant name: 1 to 64 letters, digits,
/// '_' and '-' ("fp16", "bf16", "non_ema"; nothing that could name another directory).
REMAT_API void check_weights_variant(const std::string& variant);

/// find_component_weights, then opens and validates every weight file. For a sharded component
/// the index and the shards must agree exactly: a shard the index names must exist, every key the
/// index maps to a shard must be in that shard, and every key in a shard must be mapped by the
/// index to that shard; each violation throws naming the index, the shard and the key.
REMAT_API std::vector<io::SafetensorsFile> open_component_weights(const std::string& component_dir,
                                                                 const std::string& variant = {});

/// Loads the component in `component_dir` into `module`, converting each tensor straight from
/// the mapping into the dtype of its destination (no intermediate copy: a bf16 file loads into
/// a bf16 module with no float32 tensor). With options.strict (the default) every key is checked
/// first and one error lists each missing, unexpected or shape-mismatched key with the file that
/// holds it; the module is untouched on error.
REMAT_API io::LoadReport load_component(const std::string& component_dir, torch::nn::Module& module,
                                        const io::LoadOptions& options = {}, const std::string& variant = {});

/// The shard size of the hub's writers: 10 GB, as diffusers' save_pretrained defaults to.
inline constexpr uint64_t kDefaultMaxShardBytes = uint64_t{10} * 1000 * 1000 * 1000;

/// Writes `module` as a component directory: `config.json` (the text given, checked to be a JSON
/// object) and its weights, named with `base` ("diffusion_pytorch_model" or "model"). The state
/// dict is cut into shards like huggingface_hub's rule: tensors in module order, a new shard when
/// the next tensor would take the current one past `max_shard_bytes` (a tensor larger than the
/// limit gets a shard of its own). One shard is written as `<base>.safetensors`; more as
/// `<base>-0000i-of-0000n.safetensors` plus `<base>.safetensors.index.json` ({"metadata":
/// {"total_size": bytes}, "weight_map": {key: file}}). Every file is written to a temporary file
/// and renamed; weight files of the other layout left by an earlier save are removed, so the
/// directory never holds two layouts. Creates the directory if needed.
REMAT_API void save_component(const std::string& component_dir, const torch::nn::Module& module,
                              const std::string& config_json_text,
                              uint64_t max_shard_bytes = kDefaultMaxShardBytes,
                              const std::string& base = "diffusion_pytorch_model");

}  // namespace remat::models
