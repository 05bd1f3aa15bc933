// diffusers' AutoencoderKL (models/autoencoders/autoencoder_kl.py, vae.py: Encoder, Decoder,
// DiagonalGaussianDistribution), its tiling (autoencoder_kl.py), and the latent scaling that
// FluxPipeline applies (pipelines/flux/pipeline_flux.py).

#include "remat/encoders/autoencoder_kl.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/nn/modules/container/modulelist.h>

#include "remat/default_dtype.h"
#include "remat/util/error.h"
#include "remat/io/safetensors.h"

namespace remat::encoders {
namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t padding) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).padding(padding).bias(true));
}

torch::nn::GroupNorm group_norm(int64_t groups, int64_t channels) {
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups, channels).eps(kVaeNormEps).affine(true));
}

// DownEncoderBlock2D / UpDecoderBlock2D: `resnets`, then `downsamplers.0` or `upsamplers.0`
// (registered only on blocks that resample, as diffusers does).
class ResnetStackImpl : public torch::nn::Module {
 public:
  enum class Resample { kNone, kDown, kUp };
  ResnetStackImpl(int64_t in, int64_t out, int64_t layers, int64_t groups, VaeActivation act, Resample resample)
      : resample_(resample) {
    resnets = register_module("resnets", torch::nn::ModuleList());
    for (int64_t r = 0; r < layers; ++r) resnets->push_back(ResnetBlock2D(r == 0 ? in : out, out, groups, act));
    if (resample == Resample::kDown) {
      samplers = register_module("downsamplers", torch::nn::ModuleList(Downsample2D(out)));
    } else if (resample == Resample::kUp) {
      samplers = register_module("upsamplers", torch::nn::ModuleList(Upsample2D(out)));
    }
  }
  at::Tensor forward(at::Tensor h) {
    for (const auto& r : *resnets) h = r->as<ResnetBlock2D>()->forward(h);
    if (resample_ == Resample::kDown) h = samplers[0]->as<Downsample2D>()->forward(h);
    if (resample_ == Resample::kUp) h = samplers[0]->as<Upsample2D>()->forward(h);
    return h;
  }
  torch::nn::ModuleList resnets{nullptr}, samplers{nullptr};

 private:
  Resample resample_;
};
TORCH_MODULE(ResnetStack);

}  // namespace

// ---- DiagonalGaussian ----
DiagonalGaussian::DiagonalGaussian(const at::Tensor& moments) {
  if (!(moments.dim() == 4 && moments.size(1) % 2 == 0)) {
    throw_value_error(c10::str("[vae] moments must be (B, 2 c_z, h, w), got shape ", moments.sizes()));
  }
  auto parts = moments.chunk(2, 1);
  mean = parts[0];
  logvar = at::clamp(parts[1], -30.0, 20.0);
  std = at::exp(0.5 * logvar);
  var = at::exp(logvar);
}

at::Tensor DiagonalGaussian::sample(c10::optional<at::Generator> generator) const {
  // diffusers' randn_tensor: a CPU generator draws on the CPU in the target dtype, then moves.
  const bool draw_on_cpu = generator.has_value() && generator->device().is_cpu();
  auto options = mean.options();
  if (draw_on_cpu) options = options.device(at::kCPU);
  at::Tensor eps = at::randn(mean.sizes(), generator, options);
  if (draw_on_cpu) eps = eps.to(mean.device());
  return mean + std * eps;
}

at::Tensor DiagonalGaussian::kl() const {
  return 0.5 * at::sum(at::pow(mean, 2) + var - 1.0 - logvar, {1, 2, 3});
}

// ---- Encoder ----
VaeEncoderImpl::VaeEncoderImpl(const AutoencoderKLConfig& config) {
  const auto& b = config.block_out_channels;
  const int64_t n = config.num_blocks(), G = config.norm_num_groups;
  const VaeActivation act = parse_vae_activation(config.act_fn);
  conv_in = register_module("conv_in", conv(config.in_channels, b[0], 3, 1));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < n; ++i) {
    down_blocks->push_back(ResnetStack(b[std::max<int64_t>(i - 1, 0)], b[i], config.layers_per_block, G, act,
                                       i < n - 1 ? ResnetStackImpl::Resample::kDown
                                                 : ResnetStackImpl::Resample::kNone));
  }
  mid_block = register_module("mid_block", VaeMidBlock(b.back(), G, act, config.mid_block_add_attention));
  conv_norm_out = register_module("conv_norm_out", group_norm(G, b.back()));
  conv_out = register_module("conv_out", conv(b.back(), 2 * config.latent_channels, 3, 1));
}

at::Tensor VaeEncoderImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv_in(x);
  // Each block gets the only reference to its input, so the input is freed once the block's first
  // resnet is done with it (diffusers' Encoder.forward keeps `sample` alive through the whole block).
  for (const auto& block : *down_blocks) h = block->as<ResnetStack>()->forward(std::move(h));
  h = mid_block(h);
  // diffusers' Encoder.conv_act is nn.SiLU() whatever act_fn says. Rebinding `h` frees each
  // intermediate once the next exists, as diffusers' Encoder.forward does (vae.py).
  h = activate(conv_norm_out(h), VaeActivation::kSilu, !at::GradMode::is_enabled());
  return conv_out(h);
}

// ---- Decoder ----
VaeDecoderImpl::VaeDecoderImpl(const AutoencoderKLConfig& config) {
  const std::vector<int64_t> rev(config.block_out_channels.rbegin(), config.block_out_channels.rend());
  const int64_t n = config.num_blocks(), G = config.norm_num_groups;
  const VaeActivation act = parse_vae_activation(config.act_fn);
  conv_in = register_module("conv_in", conv(config.latent_channels, rev[0], 3, 1));
  // diffusers registers the (still empty) up_blocks list before mid_block: that is the key order.
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  mid_block = register_module("mid_block", VaeMidBlock(rev[0], G, act, config.mid_block_add_attention));
  for (int64_t i = 0; i < n; ++i) {
    up_blocks->push_back(ResnetStack(rev[std::max<int64_t>(i - 1, 0)], rev[i], config.layers_per_block + 1, G, act,
                                     i < n - 1 ? ResnetStackImpl::Resample::kUp : ResnetStackImpl::Resample::kNone));
  }
  conv_norm_out = register_module("conv_norm_out", group_norm(G, rev.back()));
  conv_out = register_module("conv_out", conv(rev.back(), config.out_channels, 3, 1));
}

at::Tensor VaeDecoderImpl::forward(const at::Tensor& z) {
  at::Tensor h = mid_block(conv_in(z));
  for (const auto& block : *up_blocks) h = block->as<ResnetStack>()->forward(std::move(h));
  h = activate(conv_norm_out(h), VaeActivation::kSilu, !at::GradMode::is_enabled());
  return conv_out(h);
}

// ---- AutoencoderKL ----
AutoencoderKLImpl::AutoencoderKLImpl(const AutoencoderKLConfig& config) : config_(config) {
  config_.validate();
  encoder = register_module("encoder", VaeEncoder(config_));
  decoder = register_module("decoder", VaeDecoder(config_));
  const int64_t cz = config_.latent_channels;
  if (config_.use_quant_conv) quant_conv = register_module("quant_conv", conv(2 * cz, 2 * cz, 1, 0));
  if (config_.use_post_quant_conv) post_quant_conv = register_module("post_quant_conv", conv(cz, cz, 1, 0));
  set_tile_sample_size(config_.sample_size.front());
}

void AutoencoderKLImpl::set_tile_geometry(const TileGeometry& geometry) {
  if (geometry.sample_min_size < 1 || geometry.latent_min_size < 1 || !(geometry.overlap_factor >= 0.0) ||
      !(geometry.overlap_factor < 1.0)) {
    throw_value_error("[vae] tile geometry must have sample_min_size >= 1, latent_min_size >= 1 and overlap_factor "
                      "in [0, 1), got " + std::to_string(geometry.sample_min_size) + ", " +
                      std::to_string(geometry.latent_min_size) + ", " + std::to_string(geometry.overlap_factor));
  }
  tiles_ = geometry;
}

void AutoencoderKLImpl::set_tile_sample_size(int64_t sample_size) {
  TileGeometry g;
  g.sample_min_size = sample_size;
  // diffusers: int(sample_size / 2 ** (len(block_out_channels) - 1)), a float division truncated.
  g.latent_min_size = static_cast<int64_t>(static_cast<double>(sample_size) /
                                           static_cast<double>(config_.spatial_factor()));
  g.overlap_factor = tiles_.overlap_factor;
  set_tile_geometry(g);
}

void AutoencoderKLImpl::set_channels_last(bool enabled) {
  if (enabled) {
    for (const auto& p : parameters()) {
      if (p.scalar_type() != at::kFloat) {
        throw_value_error(std::string("[vae] channels-last convolutions need float32 weights, got ") +
                          c10::toString(p.scalar_type()) +
                          " (LibTorch 1.13's CPU GroupNorm is wrong on reduced-precision channels-last input)");
      }
    }
  }
  torch::NoGradGuard no_grad;
  const auto format = enabled ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  for (auto& p : parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(format));
  }
  channels_last_ = enabled;
}

at::Tensor AutoencoderKLImpl::in_layout(const at::Tensor& x) const {
  return channels_last_ ? x.contiguous(at::MemoryFormat::ChannelsLast) : x;
}

at::Tensor AutoencoderKLImpl::encode_one(const at::Tensor& x_in) {
  const at::Tensor x = in_layout(x_in);
  if (tiling_ && (x.size(3) > tiles_.sample_min_size || x.size(2) > tiles_.sample_min_size)) {
    const int64_t blend = static_cast<int64_t>(static_cast<double>(tiles_.latent_min_size) * tiles_.overlap_factor);
    return tiled_apply(x, tiles_.sample_min_size, tiles_.overlap_factor, blend, tiles_.latent_min_size - blend,
                       [this](const at::Tensor& tile) {
                         at::Tensor m = encoder(tile);
                         return quant_conv ? quant_conv(m) : m;
                       });
  }
  at::Tensor m = encoder(x);
  return quant_conv ? quant_conv(m) : m;
}

at::Tensor AutoencoderKLImpl::encode_moments(const at::Tensor& x) {
  if (!(x.dim() == 4 && x.size(1) == config_.in_channels)) {
    throw_value_error(
        c10::str("[vae] encode input must be (B, ", config_.in_channels, ", H, W), got shape ", x.sizes()));
  }
  if (slicing_ && x.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& one : x.split(1)) parts.push_back(encode_one(one));
    return at::cat(parts).contiguous();
  }
  return encode_one(x).contiguous();
}

DiagonalGaussian AutoencoderKLImpl::encode(const at::Tensor& x) { return DiagonalGaussian(encode_moments(x)); }

at::Tensor AutoencoderKLImpl::decode_one(const at::Tensor& z_in) {
  const at::Tensor z = in_layout(z_in);
  if (tiling_ && (z.size(3) > tiles_.latent_min_size || z.size(2) > tiles_.latent_min_size)) {
    const int64_t blend = static_cast<int64_t>(static_cast<double>(tiles_.sample_min_size) * tiles_.overlap_factor);
    return tiled_apply(z, tiles_.latent_min_size, tiles_.overlap_factor, blend, tiles_.sample_min_size - blend,
                       [this](const at::Tensor& tile) {
                         return decoder(post_quant_conv ? post_quant_conv(tile) : tile);
                       });
  }
  return decoder(post_quant_conv ? post_quant_conv(z) : z);
}

at::Tensor AutoencoderKLImpl::decode(const at::Tensor& z) {
  if (!(z.dim() == 4 && z.size(1) == config_.latent_channels)) {
    throw_value_error(
        c10::str("[vae] decode input must be (B, ", config_.latent_channels, ", h, w), got shape ", z.sizes()));
  }
  if (slicing_ && z.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& one : z.split(1)) parts.push_back(decode_one(one));
    return at::cat(parts).contiguous();
  }
  return decode_one(z).contiguous();
}

at::Tensor AutoencoderKLImpl::to_transformer_latents(const at::Tensor& z) const {
  return (z - config_.shift_factor) * config_.scaling_factor;
}

at::Tensor AutoencoderKLImpl::from_transformer_latents(const at::Tensor& latents) const {
  return latents / config_.scaling_factor + config_.shift_factor;
}

// ---- loading ----
AutoencoderKL load_autoencoder_kl(const std::vector<std::string>& paths, const AutoencoderKLConfig& config,
                                  at::ScalarType dtype) {
  if (paths.empty()) throw_value_error("[vae] load_autoencoder_kl needs at least one safetensors file, got none");
  // Built in its dtype, as diffusers' from_pretrained(torch_dtype=...) does: built in float32 and
  // then cast, a bf16 VAE would hold twice its own size while loading.
  AutoencoderKL vae{nullptr};
  {
    DefaultDtypeGuard guard(dtype);
    vae = AutoencoderKL(config);
  }
  vae->to(dtype);  // buffers and anything built outside the default dtype
  std::vector<io::SafetensorsFile> files;
  try {
    for (const auto& p : paths) files.push_back(io::SafetensorsFile::open(p));
    io::load_state_dict_into(*vae, files);
  } catch (const c10::ValueError&) {
    throw;
  } catch (const c10::Error& e) {
    // A file that does not hold this VAE is bad input: the message names the file(s) and keys.
    throw_value_error(std::string("[vae] ") + e.what_without_backtrace());
  }
  vae->eval();
  return vae;
}

AutoencoderKL load_autoencoder_kl(const std::string& path, const AutoencoderKLConfig& config, at::ScalarType dtype) {
  return load_autoencoder_kl(std::vector<std::string>{path}, config, dtype);
}

}  // namespace remat::encoders
