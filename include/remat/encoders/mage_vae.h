#pragma once
/// \file
/// Mage-VAE, MageFlow's autoencoder, as SimpleTuner vendors it
/// (simpletuner/helpers/models/mageflow/vendor/models/modules/mage_vae.py at bc8e6ab7, MageVAE):
///  - encode: the DiCo encoder, one diffusion step at t = 0 from z_t = 0: a 16 x 16 patch embedding
///    of the picture through head blocks, fused with z_t, DiCo blocks, a LayerNorm and a projection
///    to the posterior's mean and log-variance; the latent is the mean, unscaled (SimpleTuner's
///    MageVAE is built with sample_posterior False), (B, 128, H/16, W/16);
///  - decode: the CoD latent decoder (GroupNorm resnet blocks and attention in 32 x 32 windows) makes
///    the conditioning, then the DiCo denoiser at t = 0 from zero noise (a bottleneck patch embedding,
///    DiCo blocks) and its per-pixel head (the NeRF / DCT position embedding, adaLN MLP blocks, a
///    final RMSNorm and projection), folded back to (B, 3, H, W), nominally in [-1, 1] (not clamped,
///    as upstream does not clamp).
/// The DiCo blocks' adaLN modulations depend on t alone and t is always 0: as upstream's
/// _freeze_adaln_cache does, they are computed once at load (in float32) and the modulation MLPs
/// are dropped.
///
/// Weights: one `diffusion_pytorch_model.safetensors` with the encoder under
/// `student.dconv_encoder.` and the decoder under `pipeline.` (its `y_embedder.encoder.` and
/// `y_embedder.bottleneck.` are skipped, as upstream skips them). remat loads strictly by name:
/// every tensor of the model must be there with its shape, and any other key under the two
/// prefixes is an error; upstream's loader takes whatever names and shapes match and ignores the
/// rest.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "remat/export.h"
#include "remat/io/safetensors.h"

namespace remat::encoders {

/// The sizes upstream hard-codes (its constructors' defaults), adjustable for tests.
struct REMAT_API MageVaeConfig {
  int64_t latent_channels = 128;  ///< z_ch
  int64_t patch_size = 16;        ///< the downsampling factor
  int64_t hidden_size = 384;      ///< the DiCo blocks' width (encoder and denoiser), the CoD decoder's
  int64_t head_size = 768;        ///< the encoder's head blocks' width
  int64_t num_head_blocks = 2;
  int64_t num_encoder_blocks = 21;
  int64_t num_denoiser_blocks = 21;  ///< num_cond_blocks
  int64_t num_head_mlp_blocks = 3;   ///< num_blocks - num_cond_blocks of the denoiser (24 - 21)
  int64_t hidden_size_x = 32;        ///< the per-pixel head's width
  int64_t bottleneck_dim = 128;
  int64_t attention_window = 32;     ///< the CoD decoder's attention windows (latent pixels)
  double mlp_ratio = 4.0;

  /// The published sizes ("mage-vae") or remat's test size ("mage-vae-tiny": hidden 64, head 64,
  /// 2 + 2 DiCo blocks, 1 head block, 2 MLP blocks, width x 8, window 4). Throws naming the valid names.
  static MageVaeConfig preset(const std::string& name);
  /// Throws c10::ValueError naming the first invalid size (all >= 1; hidden_size a multiple of 32
  /// for the decoder's GroupNorm(32)).
  void validate() const;

  /// The parameters of upstream's checkpoint for these sizes (the modules before folding, the
  /// skipped y_embedder parts not counted), from the sizes alone.
  int64_t parameter_count() const;

  /// Reads a MageFlow pipeline's vae/config.json: upstream's MageVAE config (its ConfigMixin keys
  /// latent_channels and downsample_factor; ckpt_path and sample_posterior are ignored) and, for
  /// models smaller than the published one, the sizes upstream hard-codes, under this struct's
  /// field names (hidden_size, head_size, num_head_blocks, num_encoder_blocks,
  /// num_denoiser_blocks, num_head_mlp_blocks, hidden_size_x, bottleneck_dim, attention_window,
  /// mlp_ratio). Missing keys keep the published sizes. Throws naming the file and the key.
  static MageVaeConfig from_json_file(const std::string& path);
  /// The config.json text from_json_file reads back (`_class_name` MageVAE, every size).
  std::string to_json() const;
};

/// The DiCo encoder (`student.dconv_encoder.*`).
class MageVaeEncoderImpl;
/// The DiCo denoiser with its CoD decoder (`pipeline.*`).
class MageVaeDecoderImpl;

class REMAT_API MageVae {
 public:
  /// Builds the model in float32, loads `files` strictly (see the file comment), folds the adaLN
  /// modulations at t = 0 in float32, then casts to `dtype` (float32, bfloat16 or float64) and moves
  /// to `device`. Throws naming the missing, unexpected or mis-shaped keys and their file.
  static MageVae load(const std::vector<io::SafetensorsFile>& files, const MageVaeConfig& config,
                      at::ScalarType dtype, const at::Device& device = at::kCPU);
  /// A checkpoint in upstream's layout (`student.dconv_encoder.*`, `pipeline.*`, every key `load`
  /// reads) with random weights N(0, std^2), seeded, in `dtype`: for demo pipelines and tests.
  static std::vector<io::NamedTensor> random_checkpoint(const MageVaeConfig& config, uint64_t seed, double std,
                                                        at::ScalarType dtype);
  /// Random weights (every tensor N(0, std^2), seeded), folded: for tests and benchmarks.
  static MageVae random(const MageVaeConfig& config, uint64_t seed, double std, at::ScalarType dtype);

  /// pixels (B, 3, H, W) in [-1, 1], H and W multiples of patch_size -> the posterior mean
  /// (B, latent_channels, H / patch_size, W / patch_size) in the model's dtype. Throws
  /// c10::ValueError naming a size that is not a multiple.
  at::Tensor encode(const at::Tensor& pixels);
  /// The encoder's log-variance for the same input (clamped to [-20, 10] as upstream's _moments).
  at::Tensor encode_logvar(const at::Tensor& pixels);
  /// latents (B, latent_channels, h, w) -> pixels (B, 3, h * patch_size, w * patch_size).
  at::Tensor decode(const at::Tensor& latents);

  const MageVaeConfig& config() const { return config_; }
  /// The model's parameters and buffers (after folding), for memory accounting.
  int64_t parameter_bytes() const;

  std::shared_ptr<MageVaeEncoderImpl> encoder;
  std::shared_ptr<MageVaeDecoderImpl> decoder;

 private:
  at::Tensor moments(const at::Tensor& pixels, bool logvar);
  MageVaeConfig config_;
};

}  // namespace remat::encoders
