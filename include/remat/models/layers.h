#pragma once
/// \file
/// Building blocks shared by the Flux.1 and MageFlow transformers: a Linear with optional LoRA,
/// parameter-free LayerNorm, RMSNorm, the GELU-tanh FeedForward, AdaLN modulations and the
/// sinusoidal timestep embeddings (diffusers src/diffusers/models/: normalization.py RMSNorm,
/// AdaLayerNormZero, AdaLayerNormZeroSingle, AdaLayerNormContinuous; attention.py FeedForward;
/// embeddings.py Timesteps, TimestepEmbedding; and SimpleTuner's vendored MageFlow variant in
/// simpletuner/helpers/models/mageflow/vendor/models/modules/mage_layers.py). Module and parameter
/// names follow the diffusers checkpoints so a state dict loads without remapping.

#include <cstdint>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "remat/export.h"
#include "remat/models/quantization.h"

namespace remat::models {

/// Epsilon of every LayerNorm and RMSNorm in both models.
inline constexpr double kNormEps = 1e-6;

/// y = x W^T + b, with W (out, in) registered as `weight` and b (out) as `bias` (every Linear of
/// both models has a bias; LoRA factors have none). Optionally adds a LoRA branch
/// (alpha / r) * B(A(x)) with `lora_A` (r, in) and `lora_B` (out, r) registered as submodules, so
/// the live keys are `<path>.lora_A.weight` / `<path>.lora_B.weight` (PEFT's file names without
/// the `transformer.` prefix).
///
/// A frozen base weight can be quantised (remat/models/quantization.h): the layer then holds a
/// QuantizedWeight instead of the `weight` parameter (which is unregistered and undefined: code
/// that needs the weight's dtype or device asks weight_dtype() / weight_device(), code that needs
/// its values asks full_weight()), and forward runs quantized_linear. LoRA works on top.
class REMAT_API LinearImpl : public torch::nn::Module {
 public:
  /// Weight initialised as torch.nn.Linear (kaiming-uniform a = sqrt(5), bias U(+-1/sqrt(in))).
  LinearImpl(int64_t in_features, int64_t out_features, bool bias = true);

  /// x (..., in) -> (..., out), in the dtype of x. The LoRA branch runs in the dtype of its
  /// factors (x is cast to it) and its result is cast back to the dtype of the base output.
  at::Tensor forward(const at::Tensor& x);

  /// Adds the LoRA branch: lora_A initialised kaiming-uniform (a = sqrt(5), as PEFT), lora_B
  /// zero, so the output is unchanged until B is trained. Created on the device and in the dtype of
  /// `weight`. rank must be >= 1 and alpha > 0; calling it twice throws.
  void enable_lora(int64_t rank, double alpha);
  bool has_lora() const { return !lora_A.is_empty(); }
  int64_t lora_rank() const { return lora_rank_; }
  /// alpha / rank (0 without LoRA).
  double lora_scale() const { return lora_scale_; }

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

  // ---- quantised base weight ----
  bool is_quantized() const { return quantized_.mode != WeightQuantization::none; }
  const QuantizedWeight& quantized_weight() const { return quantized_; }
  /// Replaces the weight (full or quantised) by `weight`, which must be (out, in): the `weight`
  /// parameter is unregistered and released. The weight's dtype stays what weight_dtype() says.
  void set_quantized_weight(QuantizedWeight weight);
  /// Built under DeferLinearWeights and not yet given a weight.
  bool is_deferred() const { return deferred_; }
  /// Deferred and waiting to be quantised with awaited_precision() (resolve_deferred_linears).
  bool awaits_weight() const { return deferred_ && awaited_.mode != WeightQuantization::none; }
  const BasePrecision& awaited_precision() const { return awaited_; }
  /// Deferred: wait for a weight to quantise with `precision` (mode none: create the full weight
  /// now, initialised as the constructor does).
  void await_weight(const BasePrecision& precision);
  /// Gives a waiting layer its weight: `full` (out, in), any floating dtype and device, quantised
  /// with the awaited precision onto weight_device(). Throws c10::ValueError for a wrong shape.
  void load_awaited_weight(const at::Tensor& full);
  /// The dtype the layer computes its base in and creates LoRA factors in: the `weight`
  /// parameter's, or for a quantised / deferred layer the default dtype at construction (changed
  /// by to(dtype)).
  at::ScalarType weight_dtype() const;
  c10::Device weight_device() const;
  /// The (out, in) weight in weight_dtype(): the parameter itself, or a dequantised copy.
  at::Tensor full_weight() const;

  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  at::Tensor weight;
  at::Tensor bias;  ///< undefined when constructed with bias = false
  torch::nn::Linear lora_A{nullptr};
  torch::nn::Linear lora_B{nullptr};

 private:
  int64_t in_features_;
  int64_t out_features_;
  int64_t lora_rank_ = 0;
  double lora_scale_ = 0.0;
  QuantizedWeight quantized_;
  bool deferred_ = false;
  BasePrecision awaited_;
  at::ScalarType dtype_;   ///< weight_dtype() once `weight` is gone
  c10::Device device_{c10::kCPU};
};
TORCH_MODULE(Linear);

/// LayerNorm over the last dim without affine parameters: (x - mean) / sqrt(var_biased + eps).
REMAT_API at::Tensor layer_norm(const at::Tensor& x, double eps = kNormEps);

/// LN(x) * (1 + scale) + shift. x (B, L, D); shift and scale broadcastable to it ((B, 1, D) for
/// per-sample modulation, (1, L, D) for MageFlow's per-token modulation).
REMAT_API at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

/// GELU with the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
REMAT_API at::Tensor gelu_tanh(const at::Tensor& x);

/// Clamps to +-65504 when x is float16 (the references do this to keep fp16 finite); identity
/// for every other dtype.
REMAT_API at::Tensor clip_fp16(const at::Tensor& x);

/// RMSNorm over the last dim with a weight (dim) initialised to ones: normalise in float32
/// (rsqrt(mean(x^2) + eps)), then, as diffusers' RMSNorm: for a half/bfloat16 weight cast to its
/// dtype and multiply; otherwise multiply in float32 and cast to the dtype of x.
class REMAT_API RMSNormImpl : public torch::nn::Module {
 public:
  explicit RMSNormImpl(int64_t dim, double eps = kNormEps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

/// `net.0.proj` of a FeedForward: Linear followed by GELU-tanh (diffusers' GELU module).
class REMAT_API GeluProjectionImpl : public torch::nn::Module {
 public:
  GeluProjectionImpl(int64_t in_features, int64_t out_features);
  at::Tensor forward(const at::Tensor& x);
  Linear proj{nullptr};
};
TORCH_MODULE(GeluProjection);

/// diffusers FeedForward(dim, mult=4, activation "gelu-approximate"): `net.0.proj` Linear(D -> 4D),
/// GELU-tanh, `net.1` Dropout(p = 0) (identity, no parameters), `net.2` Linear(4D -> D).
class REMAT_API FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t dim, int64_t mult = 4);
  /// x (..., D) -> (..., D).
  at::Tensor forward(const at::Tensor& x);
  torch::nn::ModuleList net{nullptr};

 private:
  GeluProjection proj_in_{nullptr};
  Linear proj_out_{nullptr};
};
TORCH_MODULE(FeedForward);

/// diffusers TimestepEmbedding / PixArtAlphaTextProjection(act "silu"): `linear_1` (in -> D), SiLU,
/// `linear_2` (D -> D).
class REMAT_API MlpEmbedderImpl : public torch::nn::Module {
 public:
  MlpEmbedderImpl(int64_t in_features, int64_t dim);
  /// x (B, in) -> (B, D).
  at::Tensor forward(const at::Tensor& x);
  Linear linear_1{nullptr};
  Linear linear_2{nullptr};
};
TORCH_MODULE(MlpEmbedder);

/// Modulation vectors of an AdaLN layer, each (B, D) (or (tokens, D) for MageFlow).
using Modulation = std::vector<at::Tensor>;

/// AdaLayerNormZero (`norm1`, `norm1_context`): `linear` Linear(D -> 6D) on SiLU(temb), chunked
/// as shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp. Its LayerNorm (`norm`) has
/// no parameters.
class REMAT_API AdaLayerNormZeroImpl : public torch::nn::Module {
 public:
  explicit AdaLayerNormZeroImpl(int64_t dim);
  /// temb (B, D) -> the six chunks, each (B, D).
  Modulation forward(const at::Tensor& temb);
  Linear linear{nullptr};
};
TORCH_MODULE(AdaLayerNormZero);

/// AdaLayerNormZeroSingle (`norm` of a single block): `linear` Linear(D -> 3D) on SiLU(temb),
/// chunked as shift, scale, gate.
class REMAT_API AdaLayerNormZeroSingleImpl : public torch::nn::Module {
 public:
  explicit AdaLayerNormZeroSingleImpl(int64_t dim);
  /// temb (B, D) -> {shift, scale, gate}, each (B, D).
  Modulation forward(const at::Tensor& temb);
  Linear linear{nullptr};
};
TORCH_MODULE(AdaLayerNormZeroSingle);

/// AdaLayerNormContinuous (`norm_out`, no affine): `linear` Linear(D -> 2D) on SiLU(temb) cast to
/// the activation dtype, chunked as **scale, shift** (scale first, unlike AdaLayerNormZero).
class REMAT_API AdaLayerNormContinuousImpl : public torch::nn::Module {
 public:
  explicit AdaLayerNormContinuousImpl(int64_t dim);
  /// temb (B, D) -> {scale, shift}, each (B, D), in `dtype`.
  Modulation forward(const at::Tensor& temb, at::ScalarType dtype);
  Linear linear{nullptr};
};
TORCH_MODULE(AdaLayerNormContinuous);

/// Sinusoidal timestep projection of diffusers `Timesteps(num_channels, flip_sin_to_cos=True,
/// downscale_freq_shift=0, scale=1)` as Flux uses it (models/embeddings.py,
/// get_timestep_embedding): freq_k = exp(-ln(10000) k / half) in float32,
/// arg = float32(t) * freq_k, result [cos(arg) | sin(arg)],
/// float32 (B, num_channels). `t` (B) is the already-scaled timestep (Flux multiplies by 1000 in the
/// activation dtype before calling this). num_channels must be even.
REMAT_API at::Tensor flux_timestep_projection(const at::Tensor& t, int64_t num_channels = 256);

/// MageFlow's vendored variant (get_timestep_embedding in SimpleTuner's
/// simpletuner/helpers/models/mageflow/vendor/models/modules/mage_layers.py): t (n) and the
/// float32 frequency table are cast to `dtype`, the model's activation dtype (so rounded for a
/// bfloat16 or half model, unchanged in a float32 one), arg = 1000 * (float32(t) * freq) in the
/// promoted dtype, result [cos | sin]: (n, num_channels) float32, or float64 for a float64
/// `dtype`.
REMAT_API at::Tensor mageflow_timestep_projection(const at::Tensor& t, int64_t num_channels,
                                                  at::ScalarType dtype);

}  // namespace remat::models
