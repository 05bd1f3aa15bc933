#pragma once
/// \file
/// The configuration of diffusers' AutoencoderKL (the Flux VAE's `vae/config.json`), read and
/// written in diffusers' format, plus the parameter list the configuration implies (computed
/// without allocating a tensor). See docs/VAE.md, "Configuration".

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "remat/export.h"

namespace remat::encoders {

/// The fields of diffusers' `AutoencoderKL` config.json that change the network or its latents.
/// `down_block_types` / `up_block_types` must be n x "DownEncoderBlock2D" / "UpDecoderBlock2D"
/// (the only VAE blocks diffusers builds for this class) and are written back that way;
/// `force_upcast`, `latents_mean` and `latents_std` are pipeline hints that the network itself
/// never reads: force_upcast is kept for the round trip, the latents statistics must be null.
struct REMAT_API AutoencoderKLConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  /// b_0 ... b_{n-1}: the encoder's down-block widths (the decoder uses them reversed). The
  /// spatial factor is 2^(n-1).
  std::vector<int64_t> block_out_channels = {64};
  int64_t layers_per_block = 1;     ///< resnets per encoder block (the decoder runs one more)
  int64_t latent_channels = 4;      ///< c_z; the encoder emits 2 c_z (mean and logvar)
  int64_t norm_num_groups = 32;     ///< every GroupNorm; must divide every width
  std::string act_fn = "silu";      ///< resnet activation: silu, swish, mish, gelu or relu
  bool mid_block_add_attention = true;
  bool use_quant_conv = true;       ///< diffusers' defaults (true); Flux sets both to false
  bool use_post_quant_conv = true;
  double scaling_factor = 0.18215;
  double shift_factor = 0.0;        ///< diffusers' null reads as 0 (no shift)
  bool shift_factor_is_null = true; ///< so that to_json() writes null back
  bool force_upcast = true;         ///< kept for the round trip; FluxPipeline ignores it
  /// config.json allows an int or a list; only the first entry is used (for tiling).
  std::vector<int64_t> sample_size = {32};
  bool sample_size_is_list = false;

  /// Flux.1 dev / schnell: [128, 256, 512, 512], 2 layers, 16 latent channels, 32 groups, silu,
  /// mid attention, no quant convs, scaling 0.3611, shift 0.1159, sample_size 1024.
  static AutoencoderKLConfig flux();
  /// A small VAE for tests: [32, 64], 1 layer, 4 latent channels, 8 groups, mid attention, both
  /// quant convs (so that their code path is covered), scaling 0.5, shift 0.25, sample_size 32.
  static AutoencoderKLConfig tiny();

  /// Parses config.json text; `origin` (a file name) is quoted in every error. Unknown keys are
  /// ignored, as diffusers ignores them. Then validate().
  static AutoencoderKLConfig from_json_text(const std::string& text, const std::string& origin);
  /// Reads and parses a config.json file (bounded read; see remat/util/bounded_json.h).
  static AutoencoderKLConfig from_file(const std::string& path);
  /// diffusers-compatible config.json content, with "_class_name": "AutoencoderKL".
  std::string to_json() const;

  /// Throws remat::throw_value_error ("[vae] ...") naming `origin`, the key, the value and what
  /// is valid: positive channel counts, a non-empty block list, groups dividing every width,
  /// a known act_fn, finite non-zero scaling factor, positive sample size.
  void validate(const std::string& origin = "AutoencoderKLConfig") const;

  int64_t num_blocks() const { return static_cast<int64_t>(block_out_channels.size()); }
  /// 2^(n-1): pixels per latent pixel along each axis.
  int64_t spatial_factor() const { return int64_t{1} << (num_blocks() - 1); }
};

/// Queries per chunk of the VAE's mid-block attention scores (VaeAttentionImpl::query_chunk).
inline constexpr int64_t kVaeAttentionQueryChunk = 1024;

/// The bytes alive at the peak of encoding (or decoding) one `width` x `height` picture with
/// AutoencoderKL(config) at `element_bytes` per activation element, predicted from the config
/// alone for memory admission (remat caches and samples only what fits). Two terms, the larger
/// counts: a resnet at full resolution (its input, output and the convolution's working memory,
/// about four activations of width x height x block_out_channels[0]; measured in
/// tests/encoders/vae_memory_test.cpp) and the mid-block attention over (width / f) x (height / f)
/// latent pixels (eight tensors of tokens x channels in float32: the block's input, the normed
/// input, q, k, v, the attention output, its projection and the residual sum; plus one chunk of
/// scores and their softmax: VaeAttentionImpl's query chunks). `tiled`: the picture is processed in tiles of
/// sample_size[0] pixels (diffusers' enable_tiling), so the terms are those of one tile. The
/// picture itself (float32 RGB, twice for the resize) is added.
REMAT_API int64_t vae_peak_bytes(const AutoencoderKLConfig& config, int64_t width, int64_t height,
                                 int64_t element_bytes, bool tiled);

/// The names accepted for act_fn (as diffusers' get_activation; matched case-insensitively).
REMAT_API const std::vector<std::string>& vae_activation_names();

/// One parameter: diffusers' state-dict key and shape.
using ParameterShape = std::pair<std::string, std::vector<int64_t>>;

/// Every parameter of AutoencoderKL(config), in diffusers' state_dict order, computed from the
/// configuration alone (nothing is allocated). Validates `config` first.
REMAT_API std::vector<ParameterShape> parameter_shapes(const AutoencoderKLConfig& config);
/// The total number of parameters (83,819,683 for AutoencoderKLConfig::flux()).
REMAT_API int64_t parameter_count(const AutoencoderKLConfig& config);

}  // namespace remat::encoders
