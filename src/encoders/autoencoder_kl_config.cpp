// AutoencoderKLConfig: diffusers' vae/config.json, its validation, and the parameter list it
// implies (docs/VAE.md, "Configuration").

#include "remat/encoders/autoencoder_kl_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <nlohmann/json.hpp>

#include "config_json.h"
#include "string_helpers.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"

namespace remat::encoders {
namespace {

constexpr const char* kVaeComponent = "vae";
constexpr const char* kDownBlock = "DownEncoderBlock2D";
constexpr const char* kUpBlock = "UpDecoderBlock2D";

using Json = nlohmann::json;

// Every error names the file (or text) it came from, the key and the value.
[[noreturn]] void fail(const std::string& origin, const std::string& what) {
  throw_value_error(std::string("[vae] ") + origin + ": " + what);
}

using remat::detail::lower;

using remat::detail::join;
using remat::detail::shape_text;

// The keys of diffusers' models/autoencoders/autoencoder_kl.py (AutoencoderKL.__init__) read and
// written as they are (Note [Config fields] in config_json.h). sample_size, shift_factor,
// latents_mean / latents_std and the block type lists are handled by hand below.
constexpr auto vae_fields = [](auto& c, auto&& field) {
  field("in_channels", c.in_channels);
  field("out_channels", c.out_channels);
  field("block_out_channels", c.block_out_channels);
  field("layers_per_block", c.layers_per_block);
  field("latent_channels", c.latent_channels);
  field("norm_num_groups", c.norm_num_groups);
  field("act_fn", c.act_fn);
  field("mid_block_add_attention", c.mid_block_add_attention);
  field("use_quant_conv", c.use_quant_conv);
  field("use_post_quant_conv", c.use_post_quant_conv);
  field("force_upcast", c.force_upcast);
  field("scaling_factor", c.scaling_factor);
};

// down_block_types / up_block_types: only the VAE blocks diffusers' AutoencoderKL builds.
void check_block_types(const Json& j, const char* key, const char* expected, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  bool ok = it->is_array();
  if (ok) {
    for (const auto& v : *it) ok = ok && v.is_string() && v.get<std::string>() == expected;
  }
  if (!ok) {
    fail(origin, std::string("config key '") + key + "' must be a list of \"" + expected +
                     "\" (the only block AutoencoderKL supports), got " + util::json_excerpt(*it));
  }
}

void check_block_type_count(const Json& j, const char* key, size_t n, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (it->size() != n) {
    fail(origin, std::string("config key '") + key + "' must have one entry per block_out_channels entry (" +
                     std::to_string(n) + "), got " + std::to_string(it->size()));
  }
}

constexpr int64_t kMaxVaeWidth = 4096;

void check_in_range(const std::string& origin, const char* key, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    fail(origin, std::string(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                     std::to_string(value));
  }
}

}  // namespace

const std::vector<std::string>& vae_activation_names() {
  static const std::vector<std::string> names = {"silu", "swish", "mish", "gelu", "relu"};
  return names;
}

AutoencoderKLConfig AutoencoderKLConfig::flux() {
  AutoencoderKLConfig c;
  c.block_out_channels = {128, 256, 512, 512};
  c.layers_per_block = 2;
  c.latent_channels = 16;
  c.norm_num_groups = 32;
  c.use_quant_conv = false;
  c.use_post_quant_conv = false;
  c.scaling_factor = 0.3611;
  c.shift_factor = 0.1159;
  c.shift_factor_is_null = false;
  c.sample_size = {1024};
  return c;
}

AutoencoderKLConfig AutoencoderKLConfig::tiny() {
  AutoencoderKLConfig c;
  c.block_out_channels = {32, 64};
  c.layers_per_block = 1;
  c.latent_channels = 4;
  c.norm_num_groups = 8;
  c.scaling_factor = 0.5;
  c.shift_factor = 0.25;
  c.shift_factor_is_null = false;
  c.sample_size = {32};
  return c;
}

void AutoencoderKLConfig::validate(const std::string& origin) const {
  // Bounds before anything is built (a config with layers_per_block 100000 built modules until
  // memory ran out): the largest published AutoencoderKL configs (Flux.1, SD 3, SDXL: widths up to
  // 512, 2 layers per block, 4 blocks, 16 latent channels, RGB) with a wide margin.
  check_in_range(origin, "in_channels", in_channels, 1, 16);
  check_in_range(origin, "out_channels", out_channels, 1, 16);
  check_in_range(origin, "layers_per_block", layers_per_block, 1, 16);
  check_in_range(origin, "latent_channels", latent_channels, 1, 256);
  check_in_range(origin, "norm_num_groups", norm_num_groups, 1, kMaxVaeWidth);
  // 2^(n-1) must stay a sane integer; diffusers' Flux has 4 blocks.
  if (block_out_channels.empty() || block_out_channels.size() > 8) {
    fail(origin, "block_out_channels must have 1 to 8 entries, got " + shape_text(block_out_channels));
  }
  for (int64_t b : block_out_channels) {
    if (b > kMaxVaeWidth) {
      fail(origin, "every block_out_channels entry must be at most " + std::to_string(kMaxVaeWidth) + ", got " +
                       shape_text(block_out_channels));
    }
    if (b < 1 || b % norm_num_groups != 0) {
      fail(origin, "every block_out_channels entry must be a positive multiple of norm_num_groups (" +
                       std::to_string(norm_num_groups) + "), got " + shape_text(block_out_channels));
    }
  }
  const auto& names = vae_activation_names();
  if (std::find(names.begin(), names.end(), lower(act_fn)) == names.end()) {
    fail(origin, "act_fn must be one of " + join(names) + ", got '" + act_fn + "'");
  }
  if (!std::isfinite(scaling_factor) || scaling_factor == 0.0) {
    fail(origin, "scaling_factor must be finite and non-zero, got " + std::to_string(scaling_factor));
  }
  if (!std::isfinite(shift_factor)) {
    fail(origin, "shift_factor must be finite, got " + std::to_string(shift_factor));
  }
  if (sample_size.empty() || sample_size.front() < 1) {
    fail(origin, "sample_size must be a positive integer (or a list of them), got " + shape_text(sample_size));
  }
}

AutoencoderKLConfig AutoencoderKLConfig::from_json_text(const std::string& text, const std::string& origin) {
  util::check_json_text(text, util::kMaxJsonFileBytes, "[vae] " + origin);
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    fail(origin, "malformed config JSON: " + util::json_error_excerpt(e));
  }
  if (!j.is_object()) fail(origin, "config JSON must be an object");

  AutoencoderKLConfig c;
  const remat::detail::ConfigFieldReader field(j, "[vae] " + origin + ": ");
  vae_fields(c, field);
  // shift_factor: diffusers' null (no shift) reads as 0 and is written back as null.
  c.shift_factor_is_null = !field.has("shift_factor");
  field("shift_factor", c.shift_factor);
  if (c.shift_factor_is_null) c.shift_factor = 0.0;
  // sample_size: an int or a list of ints (only the first entry is used); written back as read.
  if (field.has("sample_size")) {
    c.sample_size_is_list = j.at("sample_size").is_array();
    if (c.sample_size_is_list) {
      field("sample_size", c.sample_size);
    } else {
      int64_t s = 0;
      field("sample_size", s);
      c.sample_size = {s};
    }
  }
  // latents_mean / latents_std (per-channel latent statistics) must be null; the block type lists
  // must name the only blocks AutoencoderKL builds, one per block_out_channels entry.
  for (const char* key : {"latents_mean", "latents_std"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null()) {
      fail(origin, std::string("config key '") + key + "' must be null (per-channel latent statistics are not supported), got " +
                       util::json_excerpt(*it));
    }
  }
  check_block_types(j, "down_block_types", kDownBlock, origin);
  check_block_types(j, "up_block_types", kUpBlock, origin);
  // Without *_block_types diffusers builds one block; with them their length sets n. Both must agree.
  check_block_type_count(j, "down_block_types", c.block_out_channels.size(), origin);
  check_block_type_count(j, "up_block_types", c.block_out_channels.size(), origin);
  c.validate(origin);
  return c;
}

AutoencoderKLConfig AutoencoderKLConfig::from_file(const std::string& path) {
  return from_json_text(util::read_regular_file(path, util::kMaxJsonFileBytes, kVaeComponent, "config file"), path);
}

std::string AutoencoderKLConfig::to_json() const {
  Json j;  // sorted keys
  j["_class_name"] = "AutoencoderKL";
  vae_fields(*this, remat::detail::ConfigFieldWriter{j});
  // The special cases of from_json_text, written back.
  j["down_block_types"] = std::vector<std::string>(block_out_channels.size(), kDownBlock);
  j["up_block_types"] = std::vector<std::string>(block_out_channels.size(), kUpBlock);
  if (sample_size_is_list) {
    j["sample_size"] = sample_size;
  } else {
    j["sample_size"] = sample_size.empty() ? 0 : sample_size.front();
  }
  j["shift_factor"] = shift_factor_is_null ? Json(nullptr) : Json(shift_factor);
  j["latents_mean"] = nullptr;
  j["latents_std"] = nullptr;
  return j.dump(2) + "\n";
}

// ---- parameter list: diffusers' module registration order (Encoder, Decoder in vae.py) ----
namespace {

struct ShapeList {
  std::vector<ParameterShape> out;
  void conv(const std::string& p, int64_t a, int64_t b, int64_t k) {
    out.push_back({p + ".weight", {b, a, k, k}});
    out.push_back({p + ".bias", {b}});
  }
  void norm(const std::string& p, int64_t c) {
    out.push_back({p + ".weight", {c}});
    out.push_back({p + ".bias", {c}});
  }
  void linear(const std::string& p, int64_t a, int64_t b) {
    out.push_back({p + ".weight", {b, a}});
    out.push_back({p + ".bias", {b}});
  }
  void resnet(const std::string& p, int64_t a, int64_t b) {
    norm(p + ".norm1", a);
    conv(p + ".conv1", a, b, 3);
    norm(p + ".norm2", b);
    conv(p + ".conv2", b, b, 3);
    if (a != b) conv(p + ".conv_shortcut", a, b, 1);
  }
  // UNetMidBlock2D registers `attentions` before `resnets`.
  void mid(const std::string& p, int64_t c, bool attention) {
    if (attention) {
      norm(p + ".attentions.0.group_norm", c);
      linear(p + ".attentions.0.to_q", c, c);
      linear(p + ".attentions.0.to_k", c, c);
      linear(p + ".attentions.0.to_v", c, c);
      linear(p + ".attentions.0.to_out.0", c, c);
    }
    resnet(p + ".resnets.0", c, c);
    resnet(p + ".resnets.1", c, c);
  }
};

}  // namespace

std::vector<ParameterShape> parameter_shapes(const AutoencoderKLConfig& config) {
  config.validate();
  const auto& b = config.block_out_channels;
  const int64_t n = config.num_blocks(), C = b.back(), L = config.layers_per_block;
  ShapeList s;
  // Encoder: conv_in, down_blocks, mid_block, conv_norm_out, conv_out.
  s.conv("encoder.conv_in", config.in_channels, b[0], 3);
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i);
    for (int64_t r = 0; r < L; ++r) {
      s.resnet(p + ".resnets." + std::to_string(r), r == 0 ? b[std::max<int64_t>(i - 1, 0)] : b[i], b[i]);
    }
    if (i < n - 1) s.conv(p + ".downsamplers.0.conv", b[i], b[i], 3);
  }
  s.mid("encoder.mid_block", C, config.mid_block_add_attention);
  s.norm("encoder.conv_norm_out", C);
  s.conv("encoder.conv_out", C, 2 * config.latent_channels, 3);
  // Decoder: conv_in, up_blocks (registered, empty, before mid_block), mid_block, conv_norm_out, conv_out.
  s.conv("decoder.conv_in", config.latent_channels, C, 3);
  std::vector<int64_t> rev(b.rbegin(), b.rend());
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    for (int64_t r = 0; r <= L; ++r) {
      s.resnet(p + ".resnets." + std::to_string(r), r == 0 ? rev[std::max<int64_t>(i - 1, 0)] : rev[i], rev[i]);
    }
    if (i < n - 1) s.conv(p + ".upsamplers.0.conv", rev[i], rev[i], 3);
  }
  s.mid("decoder.mid_block", C, config.mid_block_add_attention);
  s.norm("decoder.conv_norm_out", b[0]);
  s.conv("decoder.conv_out", b[0], config.out_channels, 3);
  if (config.use_quant_conv) s.conv("quant_conv", 2 * config.latent_channels, 2 * config.latent_channels, 1);
  if (config.use_post_quant_conv) s.conv("post_quant_conv", config.latent_channels, config.latent_channels, 1);
  return s.out;
}

int64_t parameter_count(const AutoencoderKLConfig& config) {
  int64_t total = 0;
  for (const auto& [name, shape] : parameter_shapes(config)) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    total += numel;
  }
  return total;
}

int64_t vae_peak_bytes(const AutoencoderKLConfig& config, int64_t width, int64_t height, int64_t element_bytes,
                       bool tiled) {
  config.validate();
  const double picture = 2.0 * 3 * static_cast<double>(width) * static_cast<double>(height) * 4;
  double w = static_cast<double>(width), h = static_cast<double>(height);
  if (tiled) {
    const double tile = static_cast<double>(config.sample_size.front());
    w = std::min(w, tile);
    h = std::min(h, tile);
  }
  const double e = static_cast<double>(element_bytes);
  const double resnet = 4.0 * w * h * static_cast<double>(config.block_out_channels.front()) * e;
  const double f = static_cast<double>(config.spatial_factor());
  const double tokens = std::ceil(w / f) * std::ceil(h / f);
  const double chunk = std::min(tokens, static_cast<double>(kVaeAttentionQueryChunk));
  const double attention = config.mid_block_add_attention
                               ? 8.0 * tokens * static_cast<double>(config.block_out_channels.back()) * 4 +
                                     2.0 * chunk * tokens * 4
                               : 0.0;
  const double total = picture + std::max(resnet, attention);
  return total >= 9.0e18 ? INT64_MAX : static_cast<int64_t>(total);
}

}  // namespace remat::encoders
