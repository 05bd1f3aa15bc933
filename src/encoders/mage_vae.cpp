// Mage-VAE (remat/encoders/mage_vae.h), written from SimpleTuner's vendored
// simpletuner/helpers/models/mageflow/vendor/models/modules/mage_vae.py (bc8e6ab7): LayerNorm2d,
// RMSNorm, TimestepEmbedder, BottleneckPatchEmbed, DiCoBlock, _EncoderDiCoBlock, NerfEmbedder,
// NerfFinalLayer, SimpleMLPAdaLN / _MLPResBlock, ResnetBlock, AttnBlock, _Decoder, _DConvEncoder,
// _DConvDenoiser and MageVAE (_moments, encode, decode, _freeze_adaln_cache). Module names follow
// upstream's, so the state-dict keys are the checkpoint's.
#include "remat/encoders/mage_vae.h"

#include <cmath>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "config_json.h"

#include "remat/models/layers.h"
#include "remat/util/error.h"

namespace remat::encoders {
namespace {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, bool bias = true, int64_t groups = 1) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).padding(kernel / 2).bias(bias).groups(groups));
}

nn::Conv2d patch_conv(int64_t in, int64_t out, int64_t patch, bool bias) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, patch).stride(patch).bias(bias));
}

nn::Linear linear(int64_t in, int64_t out) { return nn::Linear(nn::LinearOptions(in, out)); }

nn::GroupNorm group_norm(int64_t channels) {
  return nn::GroupNorm(nn::GroupNormOptions(32, channels).eps(1e-6).affine(true));
}

at::Tensor swish(const at::Tensor& x) { return x * at::sigmoid(x); }

// A plain module holding submodules or parameters under upstream's names (LibTorch parameter names
// cannot contain dots, so "norm.weight" is a parameter "weight" of a module "norm").
std::shared_ptr<nn::Module> container(nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<nn::Module>());
}

// The weight and bias of an affine LayerNorm2d (nn.LayerNorm's keys).
struct AffineParams {
  at::Tensor weight, bias;
};
AffineParams affine(nn::Module& parent, const std::string& name, int64_t size) {
  auto holder = container(parent, name);
  return {holder->register_parameter("weight", torch::ones({size})), holder->register_parameter("bias", torch::zeros({size}))};
}

// LayerNorm2d: the channels normalised at each pixel (NHWC layer_norm), eps 1e-6.
at::Tensor layer_norm_2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const at::Tensor nhwc = x.permute({0, 2, 3, 1}).contiguous();
  return at::layer_norm(nhwc, {x.size(1)}, weight, bias, 1e-6).permute({0, 3, 1, 2}).contiguous();
}

// modulate for (B, C, H, W): x * (1 + scale) + shift with (B, C) modulations.
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  const int64_t b = x.size(0), c = x.size(1);
  return x * (1 + scale.view({b, c, 1, 1})) + shift.view({b, c, 1, 1});
}

// TimestepEmbedder.timestep_embedding(t, 256) then its MLP (Linear, SiLU, Linear), at t = 0 for
// every sample: cos(0) = 1 for the first half, sin(0) = 0 for the second.
class TimestepEmbedderImpl : public nn::Module {
 public:
  explicit TimestepEmbedderImpl(int64_t hidden) {
    mlp = register_module("mlp", nn::Sequential(linear(256, hidden), nn::SiLU(), linear(hidden, hidden)));
  }
  at::Tensor at_zero() {
    const auto half = 128;
    const at::Tensor t = torch::zeros({1}, at::kFloat);
    const at::Tensor freqs = at::exp(-std::log(10000.0) * at::arange(0, half, at::kFloat) / half);
    const at::Tensor args = t.unsqueeze(1) * freqs.unsqueeze(0);
    const at::Tensor emb = at::cat({at::cos(args), at::sin(args)}, -1);
    const at::Tensor weight = mlp[0]->as<nn::Linear>()->weight;
    return mlp->forward(emb.to(weight.scalar_type()).to(weight.device()));
  }
  nn::Sequential mlp{nullptr};
};
TORCH_MODULE(TimestepEmbedder);

// The channel attention of a DiCo block: ca.0 AdaptiveAvgPool2d(1), ca.1 Conv 1x1, ca.2 Sigmoid.
nn::Sequential channel_attention(int64_t hidden) {
  return nn::Sequential(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)), conv(hidden, hidden, 1), nn::Sigmoid());
}

// DiCoBlock (adaLN, folded at t = 0) and _EncoderDiCoBlock (affine norms, no modulation).
class DiCoBlockImpl : public nn::Module {
 public:
  DiCoBlockImpl(int64_t hidden, double mlp_ratio, bool modulated) : modulated_(modulated) {
    conv1 = register_module("conv1", conv(hidden, hidden, 1));
    conv2 = register_module("conv2", conv(hidden, hidden, 3, true, hidden));
    conv3 = register_module("conv3", conv(hidden, hidden, 1));
    ca = register_module("ca", channel_attention(hidden));
    const auto ffn = static_cast<int64_t>(mlp_ratio * static_cast<double>(hidden));
    conv4 = register_module("conv4", conv(hidden, ffn, 1));
    conv5 = register_module("conv5", conv(ffn, hidden, 1));
    if (modulated_) {
      adaLN_modulation = register_module("adaLN_modulation", nn::Sequential(nn::SiLU(), linear(hidden, 6 * hidden)));
    } else {
      norm1 = affine(*this, "norm1", hidden);
      norm2 = affine(*this, "norm2", hidden);
    }
  }
  // Replaces the modulation MLP by its output for `c` (upstream's _ConstAdaLN), as a buffer.
  void fold(const at::Tensor& c) {
    torch::NoGradGuard no_grad;
    modulation_ = register_buffer("modulation", adaLN_modulation->forward(c).detach().clone());
    unregister_module("adaLN_modulation");
    adaLN_modulation = nullptr;
  }
  at::Tensor forward(const at::Tensor& inp) {
    at::Tensor x;
    std::vector<at::Tensor> m;
    if (modulated_) {
      m = modulation_.expand({inp.size(0), modulation_.size(1)}).chunk(6, 1);
      x = modulate(layer_norm_2d(inp, {}, {}), m[0], m[1]);
    } else {
      x = layer_norm_2d(inp, norm1.weight, norm1.bias);
    }
    x = at::gelu(conv2->forward(conv1->forward(x)));
    x = x * ca->forward(x);
    x = conv3->forward(x);
    if (modulated_) {
      const auto gate = [](const at::Tensor& g) { return g.unsqueeze(-1).unsqueeze(-1); };
      x = inp + gate(m[2]) * x;
      const at::Tensor y = modulate(layer_norm_2d(x, {}, {}), m[3], m[4]);
      return x + gate(m[5]) * conv5->forward(at::gelu(conv4->forward(y)));
    }
    x = inp + x;
    return x + conv5->forward(at::gelu(conv4->forward(layer_norm_2d(x, norm2.weight, norm2.bias))));
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr}, conv4{nullptr}, conv5{nullptr};
  nn::Sequential ca{nullptr}, adaLN_modulation{nullptr};
  AffineParams norm1, norm2;  // _EncoderDiCoBlock's affine LayerNorm2d

 private:
  bool modulated_;
  at::Tensor modulation_;
};
TORCH_MODULE(DiCoBlock);

// ResnetBlock of the CoD decoder (in = out channels: no shortcut convolution).
class ResnetBlockImpl : public nn::Module {
 public:
  explicit ResnetBlockImpl(int64_t ch) {
    norm1 = register_module("norm1", group_norm(ch));
    conv1 = register_module("conv1", conv(ch, ch, 3));
    norm2 = register_module("norm2", group_norm(ch));
    conv2 = register_module("conv2", conv(ch, ch, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = conv1->forward(swish(norm1->forward(x)));
    return x + conv2->forward(swish(norm2->forward(h)));
  }
  nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
};
TORCH_MODULE(ResnetBlock);

// F.pad(t, (0, pad_w, 0, pad_h), mode="replicate"): the last row and column repeated. Written
// with cat because LibTorch 1.13 has no bfloat16 replication padding on the CPU.
at::Tensor pad_edges(const at::Tensor& t, int64_t pad_h, int64_t pad_w) {
  at::Tensor out = t;
  if (pad_h > 0) out = at::cat({out, out.narrow(2, out.size(2) - 1, 1).expand({-1, -1, pad_h, -1})}, 2);
  if (pad_w > 0) out = at::cat({out, out.narrow(3, out.size(3) - 1, 1).expand({-1, -1, -1, pad_w})}, 3);
  return out;
}

// AttnBlock: self-attention within d x d windows of the (replicate-padded) grid.
class AttnBlockImpl : public nn::Module {
 public:
  AttnBlockImpl(int64_t ch, int64_t window) : window_(window) {
    norm = register_module("norm", group_norm(ch));
    q = register_module("q", conv(ch, ch, 1));
    k = register_module("k", conv(ch, ch, 1));
    v = register_module("v", conv(ch, ch, 1));
    proj_out = register_module("proj_out", conv(ch, ch, 1));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = norm->forward(x);
    at::Tensor Q = q->forward(h), K = k->forward(h), V = v->forward(h);
    const int64_t d = window_, b = Q.size(0), c = Q.size(1), H = Q.size(2), W = Q.size(3);
    const int64_t pad_h = (d - H % d) % d, pad_w = (d - W % d) % d;
    if (pad_h || pad_w) Q = pad_edges(Q, pad_h, pad_w), K = pad_edges(K, pad_h, pad_w), V = pad_edges(V, pad_h, pad_w);
    const int64_t nph = Q.size(2) / d, npw = Q.size(3) / d, np = nph * npw;
    const auto to_patches = [&](const at::Tensor& t) {
      return t.reshape({b, c, nph, d, npw, d}).permute({0, 2, 4, 1, 3, 5}).reshape({b * np, c, d * d});
    };
    Q = to_patches(Q), K = to_patches(K), V = to_patches(V);
    at::Tensor w = at::bmm(Q.permute({0, 2, 1}), K) * std::pow(static_cast<double>(c), -0.5);
    w = at::softmax(w, 2).permute({0, 2, 1});
    at::Tensor out = at::bmm(V, w).reshape({b, nph, npw, c, d, d}).permute({0, 3, 1, 4, 2, 5}).reshape(
        {b, c, nph * d, npw * d});
    if (pad_h || pad_w) out = out.narrow(2, 0, H).narrow(3, 0, W);
    return x + proj_out->forward(out);
  }
  nn::GroupNorm norm{nullptr};
  nn::Conv2d q{nullptr}, k{nullptr}, v{nullptr}, proj_out{nullptr};

 private:
  int64_t window_;
};
TORCH_MODULE(AttnBlock);

// _Decoder (`y_embedder.decoder`): latent -> the denoiser's conditioning features.
class CodDecoderImpl : public nn::Module {
 public:
  CodDecoderImpl(int64_t ch, int64_t z_ch, int64_t window) {
    conv_in = register_module("conv_in", conv(z_ch, ch, 3));
    block = register_module("block", nn::Sequential(ResnetBlock(ch), AttnBlock(ch, window), ResnetBlock(ch),
                                                    AttnBlock(ch, window), ResnetBlock(ch)));
    norm_out = register_module("norm_out", group_norm(ch));
    conv_out = register_module("conv_out", conv(ch, ch, 3));
  }
  at::Tensor forward(const at::Tensor& z) {
    const at::Tensor h = block->forward(conv_in->forward(z));
    return conv_out->forward(swish(norm_out->forward(h)));
  }
  nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  nn::Sequential block{nullptr};
  nn::GroupNorm norm_out{nullptr};
};
TORCH_MODULE(CodDecoder);

// _MLPResBlock of SimpleMLPAdaLN: adaLN from the per-position condition.
class MlpResBlockImpl : public nn::Module {
 public:
  explicit MlpResBlockImpl(int64_t ch) {
    in_ln = register_module("in_ln", nn::LayerNorm(nn::LayerNormOptions({ch}).eps(1e-6)));
    mlp = register_module("mlp", nn::Sequential(linear(ch, ch), nn::SiLU(), linear(ch, ch)));
    adaLN_modulation = register_module("adaLN_modulation", nn::Sequential(nn::SiLU(), linear(ch, 3 * ch)));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y) {
    const auto m = adaLN_modulation->forward(y).chunk(3, -1);  // shift, scale, gate
    const at::Tensor h = in_ln->forward(x) * (1 + m[1]) + m[0];
    return x + m[2] * mlp->forward(h);
  }
  nn::LayerNorm in_ln{nullptr};
  nn::Sequential mlp{nullptr}, adaLN_modulation{nullptr};
};
TORCH_MODULE(MlpResBlock);

// NerfEmbedder's DCT table for a patch of ps x ps pixels, in `dtype` as upstream computes it:
// entry [p, i * f + j] = cos(pi x_p fx_i) cos(pi y_p fy_j) / (1 + fx_i fy_j), with frequencies
// linspace(0, max_freqs, max_freqs) and positions linspace(0, 1, ps).
at::Tensor nerf_dct_table(int64_t ps, int64_t max_freqs, at::ScalarType dtype) {
  const auto o = at::TensorOptions().dtype(dtype);
  const at::Tensor pos = at::linspace(0, 1, ps, o);
  const auto grid = at::meshgrid({pos, pos}, "ij");
  const at::Tensor pos_y = grid[0].reshape({-1, 1, 1}), pos_x = grid[1].reshape({-1, 1, 1});
  const at::Tensor freqs = at::linspace(0, static_cast<double>(max_freqs), max_freqs, o);
  const at::Tensor fx = freqs.view({1, -1, 1}), fy = freqs.view({1, 1, -1});
  const at::Tensor coeffs = at::pow(1 + fx * fy, -1);
  const at::Tensor dct_x = at::cos(pos_x * fx * M_PI), dct_y = at::cos(pos_y * fy * M_PI);
  return (dct_x * dct_y * coeffs).view({1, -1, max_freqs * max_freqs});
}

}  // namespace

// _DConvEncoder.
class MageVaeEncoderImpl : public nn::Module {
 public:
  explicit MageVaeEncoderImpl(const MageVaeConfig& c) : config_(c) {
    patch_cond_embed = register_module("patch_cond_embed", patch_conv(3, c.head_size, c.patch_size, true));
    head_blocks = register_module("head_blocks", nn::ModuleList());
    for (int64_t i = 0; i < c.num_head_blocks; ++i) head_blocks->push_back(DiCoBlock(c.head_size, c.mlp_ratio, false));
    proj_down = register_module("proj_down", conv(c.head_size, c.hidden_size, 1));
    z_proj = register_module("z_proj", conv(c.latent_channels, c.hidden_size, 1));
    fuse_proj = register_module("fuse_proj", conv(2 * c.hidden_size, c.hidden_size, 1));
    t_embedder = register_module("t_embedder", TimestepEmbedder(c.hidden_size));
    blocks = register_module("blocks", nn::ModuleList());
    for (int64_t i = 0; i < c.num_encoder_blocks; ++i) blocks->push_back(DiCoBlock(c.hidden_size, c.mlp_ratio, true));
    norm_out = affine(*this, "norm_out", c.hidden_size);
    proj_out = register_module("proj_out", conv(c.hidden_size, 2 * c.latent_channels, 1));
  }
  void fold() {
    const at::Tensor t0 = t_embedder->at_zero();
    for (const auto& b : *blocks) b->as<DiCoBlockImpl>()->fold(t0);
    unregister_module("t_embedder");  // used only for the folded modulations
    t_embedder = nullptr;
  }
  // forward_pred(z_t = 0, t = 0, y = pixels): the packed (mean, logvar).
  at::Tensor forward(const at::Tensor& pixels) {
    at::Tensor cond = patch_cond_embed->forward(pixels);
    for (const auto& b : *head_blocks) cond = b->as<DiCoBlockImpl>()->forward(cond);
    cond = proj_down->forward(cond);
    // z_proj of the zero z_t is its bias at every pixel.
    const at::Tensor z = z_proj->bias.view({1, -1, 1, 1}).expand({cond.size(0), -1, cond.size(2), cond.size(3)});
    at::Tensor s = fuse_proj->forward(at::cat({cond, z}, 1));
    for (const auto& b : *blocks) s = b->as<DiCoBlockImpl>()->forward(s);
    return proj_out->forward(layer_norm_2d(s, norm_out.weight, norm_out.bias));
  }
  nn::Conv2d patch_cond_embed{nullptr}, proj_down{nullptr}, z_proj{nullptr}, fuse_proj{nullptr}, proj_out{nullptr};
  nn::ModuleList head_blocks{nullptr}, blocks{nullptr};
  TimestepEmbedder t_embedder{nullptr};
  AffineParams norm_out;

 private:
  MageVaeConfig config_;
};

// _DConvDenoiser with its y_embedder.decoder (the CoD decoder).
class MageVaeDecoderImpl : public nn::Module {
 public:
  explicit MageVaeDecoderImpl(const MageVaeConfig& c) : config_(c) {
    const int64_t p2 = c.patch_size * c.patch_size, hx = c.hidden_size_x;
    t_embedder = register_module("t_embedder", TimestepEmbedder(c.hidden_size));
    y_embedder_x = register_module("y_embedder_x", conv(c.hidden_size, hx * p2, 1));
    x_embedder_linear = linear(3 + hx + kMaxFreqs * kMaxFreqs, hx);
    container(*this, "x_embedder")->register_module("embedder", nn::Sequential(x_embedder_linear));
    s_proj1 = patch_conv(3, c.bottleneck_dim, c.patch_size, false);
    s_proj2 = conv(c.bottleneck_dim + c.hidden_size, c.hidden_size, 1);
    auto s_embedder = container(*this, "s_embedder");
    s_embedder->register_module("proj1", s_proj1);
    s_embedder->register_module("proj2", s_proj2);
    blocks = register_module("blocks", nn::ModuleList());
    for (int64_t i = 0; i < c.num_denoiser_blocks; ++i) blocks->push_back(DiCoBlock(c.hidden_size, c.mlp_ratio, true));
    cond_embed = linear(c.hidden_size, p2 * hx);
    input_proj = linear(hx, hx);
    res_blocks = nn::ModuleList();
    for (int64_t i = 0; i < c.num_head_mlp_blocks; ++i) res_blocks->push_back(MlpResBlock(hx));
    auto dec_net = container(*this, "dec_net");
    dec_net->register_module("cond_embed", cond_embed);
    dec_net->register_module("input_proj", input_proj);
    dec_net->register_module("res_blocks", res_blocks);
    final_linear = linear(hx, 3);
    auto final_layer = container(*this, "final_layer");
    final_norm = final_layer->register_module("norm", models::RMSNorm(hx, 1e-6));
    final_layer->register_module("linear", final_linear);
    y_decoder = CodDecoder(c.hidden_size, c.bottleneck_dim, c.attention_window);
    container(*this, "y_embedder")->register_module("decoder", y_decoder);
  }
  void fold() {
    const at::Tensor t0 = t_embedder->at_zero();
    for (const auto& b : *blocks) b->as<DiCoBlockImpl>()->fold(t0);
    unregister_module("t_embedder");
    t_embedder = nullptr;
  }
  at::Tensor forward(const at::Tensor& latents) {
    const MageVaeConfig& c = config_;
    const at::Tensor cond = y_decoder->forward(latents);
    const int64_t b = latents.size(0), h = latents.size(2), w = latents.size(3), L = h * w;
    const int64_t ps = c.patch_size, p2 = ps * ps;
    // s_embedder(noise = 0, cond): proj1 of zero pixels (no bias) is zero.
    const at::Tensor zero_patches = torch::zeros({b, c.bottleneck_dim, h, w}, cond.options());
    at::Tensor s = s_proj2->forward(at::cat({zero_patches, cond}, 1));
    for (const auto& block : *blocks) s = block->as<DiCoBlockImpl>()->forward(s);
    s = s.permute({0, 2, 3, 1}).reshape({-1, c.hidden_size});
    // unfold(noise = 0) is zero: 3 x p2 zero channels, then y_embedder_x(cond) as (hx, p2) per patch.
    const at::Tensor x_pix = torch::zeros({b, 3 * p2, L}, cond.options());
    at::Tensor x = at::cat({x_pix, y_embedder_x->forward(cond).flatten(2)}, 1);
    x = x.reshape({b, -1, p2, L}).permute({0, 3, 2, 1}).flatten(0, 1);  // (b L, p2, 3 + hx)
    // NerfEmbedder: the DCT position table appended, then its Linear.
    const at::Tensor dct = nerf_dct_table(ps, kMaxFreqs, x.scalar_type()).to(x.device()).expand({x.size(0), -1, -1});
    x = x_embedder_linear->forward(at::cat({x, dct}, -1));
    // SimpleMLPAdaLN.
    x = input_proj->forward(x);
    const at::Tensor y = cond_embed->forward(s).reshape({s.size(0), p2, -1});
    for (const auto& block : *res_blocks) x = block->as<MlpResBlockImpl>()->forward(x, y);
    // NerfFinalLayer: RMSNorm (upstream's: float32, back to the dtype, times the weight), then the Linear.
    x = final_linear->forward(final_norm->forward(x));  // (b L, p2, 3)
    x = x.transpose(1, 2).reshape({b, L, -1}).transpose(1, 2).contiguous();  // (b, 3 p2, L)
    return F::fold(x, F::FoldFuncOptions({h * ps, w * ps}, {ps, ps}).stride({ps, ps}));
  }
  static constexpr int64_t kMaxFreqs = 8;
  TimestepEmbedder t_embedder{nullptr};
  nn::Conv2d y_embedder_x{nullptr}, s_proj1{nullptr}, s_proj2{nullptr};
  nn::Linear x_embedder_linear{nullptr}, cond_embed{nullptr}, input_proj{nullptr}, final_linear{nullptr};
  nn::ModuleList blocks{nullptr}, res_blocks{nullptr};
  models::RMSNorm final_norm{nullptr};
  CodDecoder y_decoder{nullptr};

 private:
  MageVaeConfig config_;
};

MageVaeConfig MageVaeConfig::preset(const std::string& name) {
  if (name == "mage-vae") return MageVaeConfig{};
  if (name == "mage-vae-tiny") {
    MageVaeConfig c;
    c.hidden_size = 64;
    c.head_size = 64;
    c.num_head_blocks = 1;
    c.num_encoder_blocks = 2;
    c.num_denoiser_blocks = 2;
    c.num_head_mlp_blocks = 2;
    c.hidden_size_x = 8;
    c.bottleneck_dim = 16;
    c.latent_channels = 16;
    c.attention_window = 4;
    return c;
  }
  throw_value_error("[mage-vae] unknown preset '" + name + "'; presets: mage-vae, mage-vae-tiny");
}

void MageVaeConfig::validate() const {
  for (const auto& [name, value] :
       std::vector<std::pair<const char*, int64_t>>{{"latent_channels", latent_channels}, {"patch_size", patch_size},
                                                    {"hidden_size", hidden_size}, {"head_size", head_size},
                                                    {"num_head_blocks", num_head_blocks},
                                                    {"num_encoder_blocks", num_encoder_blocks},
                                                    {"num_denoiser_blocks", num_denoiser_blocks},
                                                    {"num_head_mlp_blocks", num_head_mlp_blocks},
                                                    {"hidden_size_x", hidden_size_x}, {"bottleneck_dim", bottleneck_dim},
                                                    {"attention_window", attention_window}}) {
    if (value < 1) throw_value_error(std::string("[mage-vae] ") + name + " must be at least 1, got " + std::to_string(value));
  }
  if (hidden_size % 32 != 0) {
    throw_value_error("[mage-vae] hidden_size must be a multiple of 32 (the CoD decoder's GroupNorm has 32 groups), got " +
                      std::to_string(hidden_size));
  }
  if (!(mlp_ratio > 0)) throw_value_error("[mage-vae] mlp_ratio must be above 0");
  if (bottleneck_dim != latent_channels) {
    // MageVAE.decode feeds the latent to y_embedder.decoder, whose conv_in takes bottleneck_dim channels.
    throw_value_error("[mage-vae] bottleneck_dim (" + std::to_string(bottleneck_dim) + ") must equal latent_channels (" +
                      std::to_string(latent_channels) + "): the CoD decoder reads the latent");
  }
}

int64_t MageVaeConfig::parameter_count() const {
  validate();
  const int64_t h = hidden_size, hx = hidden_size_x, lc = latent_channels, p2 = patch_size * patch_size;
  // One DiCo block of width w: five 1x1 convolutions, the 3x3 depthwise one and the channel
  // attention's, then its adaLN MLP (modulated) or two LayerNorms (the encoder's head blocks).
  const auto dico = [&](int64_t w, bool modulated) {
    const auto f = static_cast<int64_t>(mlp_ratio * static_cast<double>(w));
    const int64_t convs = 3 * (w * w + w) + (9 * w + w) + (f * w + f) + (w * f + w);
    return convs + (modulated ? 6 * w * w + 6 * w : 4 * w);
  };
  const int64_t t_embedder = h * 256 + h + h * h + h;
  const int64_t encoder = head_size * 3 * p2 + head_size + num_head_blocks * dico(head_size, false) +
                          (h * head_size + h) + (h * lc + h) + (2 * h * h + h) + t_embedder +
                          num_encoder_blocks * dico(h, true) + 2 * h + (2 * lc * h + 2 * lc);
  const int64_t resnet = 2 * (2 * h + 9 * h * h + h), attention = 2 * h + 4 * (h * h + h);
  const int64_t cod = (9 * h * lc + h) + 3 * resnet + 2 * attention + 2 * h + (9 * h * h + h);
  const int64_t head_mlp = 2 * hx + 2 * (hx * hx + hx) + (3 * hx * hx + 3 * hx);
  const int64_t decoder = t_embedder + (hx * p2 * h + hx * p2) + (hx * (3 + hx + 64) + hx) + bottleneck_dim * 3 * p2 +
                          (h * (bottleneck_dim + h) + h) + num_denoiser_blocks * dico(h, true) +
                          (p2 * hx * h + p2 * hx) + (hx * hx + hx) + num_head_mlp_blocks * head_mlp + hx +
                          (3 * hx + 3) + cod;
  return encoder + decoder;
}

namespace {

// The sizes a vae/config.json may hold, by the struct's field names (Note [Config fields] in
// config_json.h); latent_channels and downsample_factor are upstream's own keys.
constexpr auto mage_vae_fields = [](auto& c, auto&& field) {
  field("latent_channels", c.latent_channels);
  field("downsample_factor", c.patch_size);
  field("hidden_size", c.hidden_size);
  field("head_size", c.head_size);
  field("num_head_blocks", c.num_head_blocks);
  field("num_encoder_blocks", c.num_encoder_blocks);
  field("num_denoiser_blocks", c.num_denoiser_blocks);
  field("num_head_mlp_blocks", c.num_head_mlp_blocks);
  field("hidden_size_x", c.hidden_size_x);
  field("bottleneck_dim", c.bottleneck_dim);
  field("attention_window", c.attention_window);
  field("mlp_ratio", c.mlp_ratio);
};

}  // namespace

MageVaeConfig MageVaeConfig::from_json_file(const std::string& path) {
  return remat::detail::parse_config_file(path, "mage-vae", [](const std::string& text) {
    const nlohmann::json j = remat::detail::parse_config_json(text, "mage-vae");
    MageVaeConfig c;
    const remat::detail::ConfigFieldReader field(j, "[mage-vae] ");
    mage_vae_fields(c, field);
    c.validate();
    return c;
  });
}

std::string MageVaeConfig::to_json() const {
  validate();
  nlohmann::ordered_json j;
  j["_class_name"] = "MageVAE";
  j["sample_posterior"] = false;
  mage_vae_fields(*this, [&](const char* key, const auto& value) { j[key] = value; });
  return j.dump(2) + "\n";
}

namespace {

MageVae build(const MageVaeConfig& config) {
  config.validate();
  MageVae vae;
  vae.encoder = std::make_shared<MageVaeEncoderImpl>(config);
  vae.decoder = std::make_shared<MageVaeDecoderImpl>(config);
  return vae;
}

void finish(MageVae& vae, at::ScalarType dtype, const at::Device& device) {
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kDouble) {
    throw_value_error(std::string("[mage-vae] dtype must be float32, bfloat16 or float64, got ") + c10::toString(dtype));
  }
  // Upstream folds at construction, in float32, before from_pretrained casts the model.
  torch::NoGradGuard no_grad;
  vae.encoder->fold();
  vae.decoder->fold();
  vae.encoder->to(device, dtype);
  vae.decoder->to(device, dtype);
  vae.encoder->eval();
  vae.decoder->eval();
}

}  // namespace

MageVae MageVae::load(const std::vector<io::SafetensorsFile>& files, const MageVaeConfig& config, at::ScalarType dtype,
                      const at::Device& device) {
  MageVae vae = build(config);
  vae.config_ = config;
  {
    io::LoadOptions options;
    options.strip_prefix = "student.dconv_encoder.";
    options.key_filter = [](const std::string& key) { return key.rfind("student.dconv_encoder.", 0) == 0; };
    io::load_state_dict_into(*vae.encoder, files, options);
  }
  {
    io::LoadOptions options;
    options.strip_prefix = "pipeline.";
    options.key_filter = [](const std::string& key) {
      return key.rfind("pipeline.", 0) == 0 && key.rfind("pipeline.y_embedder.encoder.", 0) != 0 &&
             key.rfind("pipeline.y_embedder.bottleneck.", 0) != 0;
    };
    io::load_state_dict_into(*vae.decoder, files, options);
  }
  finish(vae, dtype, device);
  return vae;
}

std::vector<io::NamedTensor> MageVae::random_checkpoint(const MageVaeConfig& config, uint64_t seed, double std,
                                                        at::ScalarType dtype) {
  // The modules before folding carry upstream's names (load strips these prefixes).
  const MageVae vae = build(config);
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  std::vector<io::NamedTensor> out;
  const auto add = [&](const std::string& prefix, const nn::Module& module) {
    for (const auto& item : module.named_parameters()) {
      out.emplace_back(prefix + item.key(), (torch::randn(item.value().sizes()) * std).to(dtype));
    }
  };
  add("student.dconv_encoder.", *vae.encoder);
  add("pipeline.", *vae.decoder);
  return out;
}

MageVae MageVae::random(const MageVaeConfig& config, uint64_t seed, double std, at::ScalarType dtype) {
  MageVae vae = build(config);
  vae.config_ = config;
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto* module : {static_cast<nn::Module*>(vae.encoder.get()), static_cast<nn::Module*>(vae.decoder.get())}) {
    for (auto& p : module->parameters()) p.normal_(0, std);
  }
  finish(vae, dtype, at::kCPU);
  return vae;
}

at::Tensor MageVae::moments(const at::Tensor& pixels, bool logvar) {
  const int64_t ps = config_.patch_size;
  if (pixels.dim() != 4 || pixels.size(1) != 3) {
    throw_value_error("[mage-vae] pixels must be (B, 3, H, W), got " + c10::str(pixels.sizes()));
  }
  if (pixels.size(2) % ps != 0 || pixels.size(3) % ps != 0) {
    throw_value_error("[mage-vae] H, W must be multiples of " + std::to_string(ps) + ", got (" +
                      std::to_string(pixels.size(2)) + ", " + std::to_string(pixels.size(3)) + ")");
  }
  torch::NoGradGuard no_grad;
  const at::Tensor out = encoder->forward(pixels);
  const int64_t z = config_.latent_channels;
  return logvar ? out.narrow(1, z, z).clamp(-20.0, 10.0) : out.narrow(1, 0, z).contiguous();
}

at::Tensor MageVae::encode(const at::Tensor& pixels) { return moments(pixels, false); }

at::Tensor MageVae::encode_logvar(const at::Tensor& pixels) { return moments(pixels, true); }

at::Tensor MageVae::decode(const at::Tensor& latents) {
  if (latents.dim() != 4 || latents.size(1) != config_.latent_channels) {
    throw_value_error("[mage-vae] latents must be (B, " + std::to_string(config_.latent_channels) + ", h, w), got " +
                      c10::str(latents.sizes()));
  }
  torch::NoGradGuard no_grad;
  return decoder->forward(latents);
}

int64_t MageVae::parameter_bytes() const {
  int64_t bytes = 0;
  for (auto* module : {static_cast<nn::Module*>(encoder.get()), static_cast<nn::Module*>(decoder.get())}) {
    for (const auto& p : module->parameters()) bytes += static_cast<int64_t>(p.nbytes());
    for (const auto& b : module->buffers()) bytes += static_cast<int64_t>(b.nbytes());
  }
  return bytes;
}

}  // namespace remat::encoders
