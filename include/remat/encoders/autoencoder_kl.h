#pragma once
/// \file
/// Flux's VAE: diffusers' AutoencoderKL in LibTorch (src/diffusers/models/autoencoders/
/// autoencoder_kl.py and vae.py; docs/VAE.md), with diffusers' state-dict
/// key names, so `vae/diffusion_pytorch_model.safetensors` loads without remapping.
///
///   AutoencoderKL vae = load_autoencoder_kl(path, AutoencoderKLConfig::flux(), at::kBFloat16);
///   DiagonalGaussian posterior = vae->encode(image);          // image in [-1, 1], (B, 3, H, W)
///   at::Tensor latents = vae->to_transformer_latents(posterior.sample(gen));
///   at::Tensor image2 = vae->decode(vae->from_transformer_latents(latents));
///
/// Runs in the dtype of its weights (fp32, bf16, fp16; float64 for tests); inputs must match it.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Optional.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "remat/encoders/autoencoder_kl_config.h"
#include "remat/encoders/vae_blocks.h"
#include "remat/encoders/vae_tiling.h"
#include "remat/export.h"

namespace remat::encoders {

/// diffusers' DiagonalGaussianDistribution (models/autoencoders/vae.py) over the encoder's moments:
/// mean, logvar = moments.chunk(2, dim 1); logvar clamped to [-30, 20]; std = exp(logvar / 2);
/// var = exp(logvar). Tensors are (B, c_z, h, w) in the moments' dtype.
struct REMAT_API DiagonalGaussian {
  at::Tensor mean, logvar, std, var;

  explicit DiagonalGaussian(const at::Tensor& moments);
  /// mean + std * eps, eps = randn(mean.shape) drawn from `generator` in mean's dtype; as
  /// diffusers' randn_tensor, a CPU generator draws on the CPU and the noise is then moved to
  /// mean's device. Without a generator, the default one of mean's device.
  at::Tensor sample(c10::optional<at::Generator> generator = c10::nullopt) const;
  /// The mean (deterministic encoding).
  at::Tensor mode() const { return mean; }
  /// KL divergence to N(0, 1) per image: 0.5 * sum over (C, H, W) of mean^2 + var - 1 - logvar, (B).
  at::Tensor kl() const;
};

/// The encoder (`encoder.*`): conv_in, down_blocks, mid_block, conv_norm_out, SiLU, conv_out.
/// (B, in_channels, H, W) -> (B, 2 c_z, H / 2^(n-1), W / 2^(n-1)) (sizes floor at each level).
class REMAT_API VaeEncoderImpl : public torch::nn::Module {
 public:
  explicit VaeEncoderImpl(const AutoencoderKLConfig& config);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Conv2d conv_in{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};  ///< each: resnets (ModuleList), [downsamplers]
  VaeMidBlock mid_block{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
  torch::nn::Conv2d conv_out{nullptr};
};
TORCH_MODULE(VaeEncoder);

/// The decoder (`decoder.*`): conv_in, mid_block, up_blocks (reversed widths, layers_per_block + 1
/// resnets each), conv_norm_out, SiLU, conv_out. (B, c_z, h, w) -> (B, out_channels, 2^(n-1) h, ...).
class REMAT_API VaeDecoderImpl : public torch::nn::Module {
 public:
  explicit VaeDecoderImpl(const AutoencoderKLConfig& config);
  at::Tensor forward(const at::Tensor& z);

  torch::nn::Conv2d conv_in{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};  ///< each: resnets (ModuleList), [upsamplers]
  VaeMidBlock mid_block{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
  torch::nn::Conv2d conv_out{nullptr};
};
TORCH_MODULE(VaeDecoder);

/// diffusers' AutoencoderKL. Keys: encoder.*, decoder.*, quant_conv.* and post_quant_conv.* (the
/// last two only when the config enables them; Flux has neither), in diffusers' state_dict order.
class REMAT_API AutoencoderKLImpl : public torch::nn::Module {
 public:
  /// Validates `config` and builds the module with LibTorch's default (random) initialisation.
  explicit AutoencoderKLImpl(const AutoencoderKLConfig& config);

  /// Encodes images in [-1, 1], (B, in_channels, H, W), to the posterior over latents
  /// (B, c_z, H / 2^(n-1), W / 2^(n-1)). With slicing, one image at a time; with tiling, in tiles
  /// when H or W exceeds the sample tile size.
  DiagonalGaussian encode(const at::Tensor& x);
  /// The raw moments (B, 2 c_z, h, w) that encode() wraps (after quant_conv when configured).
  at::Tensor encode_moments(const at::Tensor& x);
  /// Decodes latents (B, c_z, h, w) to images (B, out_channels, 2^(n-1) h, 2^(n-1) w), roughly in
  /// [-1, 1] (not clamped). With tiling, in tiles when h or w exceeds the latent tile size.
  at::Tensor decode(const at::Tensor& z);

  /// (z - shift_factor) * scaling_factor: VAE latents to the transformer's latent space.
  at::Tensor to_transformer_latents(const at::Tensor& z) const;
  /// z / scaling_factor + shift_factor (divide, then add, as FluxPipeline does).
  at::Tensor from_transformer_latents(const at::Tensor& latents) const;

  /// Slicing: a batch is encoded / decoded one image at a time (identical results, lower peak).
  void set_slicing(bool enabled) { slicing_ = enabled; }
  bool slicing() const { return slicing_; }
  /// Tiling (diffusers' enable_tiling): see remat/encoders/vae_tiling.h.
  void set_tiling(bool enabled) { tiling_ = enabled; }
  bool tiling() const { return tiling_; }
  /// Sets the tile geometry (diffusers' tile_sample_min_size, tile_latent_min_size,
  /// tile_overlap_factor attributes). Throws remat::throw_value_error for sizes < 1 or an
  /// overlap factor outside [0, 1).
  void set_tile_geometry(const TileGeometry& geometry);
  /// Tiles of `sample_size` pixels and sample_size / 2^(n-1) latent pixels, as diffusers derives
  /// them from config.sample_size.
  void set_tile_sample_size(int64_t sample_size);
  const TileGeometry& tile_geometry() const { return tiles_; }

  /// Channels-last convolutions: the 4-D convolution weights are stored NHWC and encode / decode
  /// run on NHWC activations (PyTorch's torch.channels_last), returning contiguous (NCHW)
  /// results. The same computation in another memory layout: results agree to float32 rounding,
  /// and one activation less is held around each convolution. Off by default: LibTorch 2.x's CPU
  /// GroupNorm on NHWC input gives bits that depend on the thread count (so caches written by
  /// different process counts would differ), and on LibTorch 1.13 it is slower (docs/VAE.md).
  /// float32 only: LibTorch 1.13's CPU GroupNorm gives wrong results on bf16 channels-last input.
  /// `enabled` false restores NCHW weights.
  void set_channels_last(bool enabled);
  bool channels_last() const { return channels_last_; }

  const AutoencoderKLConfig& config() const { return config_; }

  VaeEncoder encoder{nullptr};
  VaeDecoder decoder{nullptr};
  torch::nn::Conv2d quant_conv{nullptr};       ///< null unless config.use_quant_conv
  torch::nn::Conv2d post_quant_conv{nullptr};  ///< null unless config.use_post_quant_conv

 private:
  at::Tensor encode_one(const at::Tensor& x);  // diffusers' _encode
  at::Tensor decode_one(const at::Tensor& z);  // diffusers' _decode
  at::Tensor in_layout(const at::Tensor& x) const;  // NHWC when channels_last_
  AutoencoderKLConfig config_;
  bool slicing_ = false;
  bool tiling_ = false;
  bool channels_last_ = false;
  TileGeometry tiles_;
};
TORCH_MODULE(AutoencoderKL);

/// Builds AutoencoderKL(config) in `dtype` and loads the safetensors file(s) strictly (every
/// key present with the right shape, no extra key): errors name the file(s) and the keys.
/// `paths` is one path or the shards of one checkpoint. Tensors are converted to `dtype` on load.
REMAT_API AutoencoderKL load_autoencoder_kl(const std::vector<std::string>& paths, const AutoencoderKLConfig& config,
                                            at::ScalarType dtype = at::kFloat);
REMAT_API AutoencoderKL load_autoencoder_kl(const std::string& path, const AutoencoderKLConfig& config,
                                            at::ScalarType dtype = at::kFloat);

}  // namespace remat::encoders
