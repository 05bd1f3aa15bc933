#pragma once
/// \file
/// Weight-only quantisation of a model's frozen Linear weights (SimpleTuner's
/// `base_model_precision`): int8 with one symmetric scale per output channel, NF4 (QLoRA's 4-bit
/// NormalFloat, absmax scales per block of 64, optionally double-quantised), and fp8 e4m3 with one
/// scale per output channel where the LibTorch in use has float8 dtypes (2.1+).
///
/// A quantised Linear keeps only the quantised data and its scales; forward and backward
/// dequantise the weight into a temporary that dies with the layer's call (the base weight takes
/// no gradient, the input does). Checkpoint recomputation runs the same path, so it is bitwise
/// equal to the first forward.
///
/// Building a model quantised without its full-precision weights: construct it under
/// DeferLinearWeights, then resolve_deferred_linears (the Linears that stay full precision get
/// their weights, the quantised ones wait), then either load a file (models::load_flux_weights /
/// load_mageflow-style loaders quantise each awaiting weight as it streams by) or
/// initialize_awaiting_linears (random weights, quantised one at a time). Peak: the quantised model
/// plus one full-precision weight.

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include "remat/export.h"

namespace remat::models {

/// How the frozen base weights are stored.
enum class WeightQuantization {
  none,  ///< the training dtype (SimpleTuner's "no_change")
  int8,  ///< int8, one float32 scale per output channel (absmax / 127, symmetric)
  nf4,   ///< 4-bit NormalFloat, two codes per byte, float32 absmax per block of 64
  fp8,   ///< float8 e4m3fn, one float32 scale per output channel (absmax / 448)
};

/// What a `base_model_precision` value means for remat.
struct BasePrecision {
  std::string name;                      ///< as given, e.g. "int8-quanto"
  WeightQuantization mode = WeightQuantization::none;
  bool double_quantization = false;      ///< NF4: the block scales are themselves quantised
};

/// Parses SimpleTuner's `base_model_precision` names: "no_change"; the int8 weight-only names
/// ("int8-quanto", "int8-torchao", ...); "nf4-bnb" (double quantisation on, as SimpleTuner's
/// bitsandbytes config sets it); the fp8 weight-only names. Every other SimpleTuner name (int4,
/// int2, dynamic activation quantisation, SDNQ, TransformerEngine ...) is refused by name with
/// what remat supports. Throws c10::ValueError.
REMAT_API BasePrecision parse_base_model_precision(const std::string& name);
/// Every name parse_base_model_precision accepts, "no_change" first.
REMAT_API std::vector<std::string> supported_base_model_precisions();
/// "none", "int8", "nf4", "fp8".
REMAT_API std::string to_string(WeightQuantization mode);

/// Whether this LibTorch has float8 dtypes (PyTorch 2.1+). fp8 modes throw c10::ValueError
/// naming the requirement where it is false.
REMAT_API bool float8_supported();

/// QLoRA's NF4 code book: the 16 values, ascending, -1 ... 0 ... 1.
REMAT_API const std::array<float, 16>& nf4_code_book();

/// bitsandbytes' signed dynamic 8-bit code (create_dynamic_map(signed=True, 7 exponent bits)):
/// for i = 0..6 the 2^i midpoints of linspace(0.1, 1, 2^i + 1) times +-10^(i-6), plus 0 and 1;
/// 256 values ascending (computed in float64, rounded to float32). Double quantisation stores
/// each NF4 block scale as the index of its nearest value here.
REMAT_API const std::array<float, 256>& dynamic_8bit_code();

/// NF4 block size (weights per absmax scale) and, with double quantisation, scales per
/// second-level block.
inline constexpr int64_t kNf4BlockSize = 64;
inline constexpr int64_t kNf4ScaleBlockSize = 256;

/// Elements the quantisers process per step: their float32 / index temporaries stay within a few
/// chunks (well under 32 bytes per chunk element), so quantising a tensor streamed from a file
/// never holds a full float32 copy of it.
inline constexpr int64_t kQuantizeChunkElements = int64_t{1} << 14;

/// A quantised (out, in) weight.
struct REMAT_API QuantizedWeight {
  WeightQuantization mode = WeightQuantization::none;
  int64_t out_features = 0;
  int64_t in_features = 0;
  /// int8: (out, in) kInt8. nf4: (ceil(out * in / 2)) kByte, two codes per byte. fp8: (out, in).
  at::Tensor data;
  /// int8 / fp8: (out) float32. nf4: (blocks) float32, or kByte codes with double quantisation.
  at::Tensor scales;
  /// nf4 with double quantisation: float32 absmax per kNf4ScaleBlockSize scales, and the float32
  /// mean subtracted from the scales before quantising them (scalar). Undefined otherwise.
  at::Tensor scale_scales;
  at::Tensor scale_offset;

  /// Bytes held by the tensors above.
  int64_t bytes() const;
  /// Moves every tensor to `device`.
  QuantizedWeight to(const at::Device& device) const;
};

/// Quantises `weight` (out, in), any floating dtype, on its device. Throws c10::ValueError for a
/// tensor that is not 2-D floating, for WeightQuantization::none, and for fp8 without float8
/// support.
REMAT_API QuantizedWeight quantize_weight(const at::Tensor& weight, WeightQuantization mode,
                                          bool double_quantization = false);
/// The (out, in) weight in `dtype`.
REMAT_API at::Tensor dequantize_weight(const QuantizedWeight& weight, at::ScalarType dtype);

/// y = x W^T + b with W dequantised for this call only (forward, and again in backward for the
/// input gradient). `bias` may be undefined; it is frozen (no gradient). x (..., in) -> (..., out)
/// in the dtype of x.
REMAT_API at::Tensor quantized_linear(const at::Tensor& x, const QuantizedWeight& weight, const at::Tensor& bias);

/// Bytes a quantised (out, in) weight holds (data and scales), from its shape alone: what the
/// memory model charges.
REMAT_API int64_t quantized_weight_bytes(int64_t out_features, int64_t in_features, const BasePrecision& precision);

/// Whether the Linear named `name` (a qualified module path, e.g.
/// "transformer_blocks.0.attn.to_q") is quantised: the attention, feed-forward and modulation
/// Linears of the blocks and the final modulation; never the embedders of a few rows, the output
/// projection, norms or LoRA factors.
REMAT_API bool is_quantized_linear_name(const std::string& name);

/// While alive, on this thread, remat::models::Linear constructors register no `weight` (the
/// bias is created as usual): the first step of building a model quantised without allocating
/// its full-precision weights. Not nestable.
class REMAT_API DeferLinearWeights {
 public:
  DeferLinearWeights();
  ~DeferLinearWeights();
  DeferLinearWeights(const DeferLinearWeights&) = delete;
  DeferLinearWeights& operator=(const DeferLinearWeights&) = delete;
  /// Whether a guard is alive on this thread.
  static bool active();
};

/// After a module was built under DeferLinearWeights: each deferred Linear whose qualified name
/// passes is_quantized_linear_name (and precision is not none) waits for its weight with
/// `precision` (LinearImpl::awaits_weight); every other one gets its full-precision weight now,
/// initialised as the constructor would, in the default dtype. Returns the waiting names.
REMAT_API std::vector<std::string> resolve_deferred_linears(torch::nn::Module& module, const BasePrecision& precision);

/// Gives every waiting Linear of `module` a weight initialised as torch.nn.Linear's
/// (kaiming-uniform, in float32 on the module's device), quantised at once, so one full weight
/// is alive at a time: a randomly initialised quantised model. `generator`-free: uses the global
/// generator like the constructors.
REMAT_API void initialize_awaiting_linears(torch::nn::Module& module);

/// The state-dict keys ("<module>.weight") of the Linears of `module` that wait for a weight to
/// quantise (LinearImpl::awaits_weight), sorted. Loaders route such a module through
/// models::load_state_dict_quantizing.
REMAT_API std::vector<std::string> awaiting_weight_keys(torch::nn::Module& module);

/// Quantises, in place, every remat::models::Linear of `module` whose qualified name passes
/// is_quantized_linear_name (its full-precision weight is released layer by layer). Returns the
/// quantised module names. A no-op returning {} for WeightQuantization::none.
REMAT_API std::vector<std::string> quantize_linear_layers(torch::nn::Module& module, const BasePrecision& precision);

}  // namespace remat::models
