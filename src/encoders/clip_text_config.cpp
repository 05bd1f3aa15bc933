// ClipTextConfig: transformers' CLIPTextConfig (configuration_clip.py) as text_encoder/config.json
// stores it, and the parameter count of CLIPTextModel.

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "config_json.h"
#include "remat/encoders/clip_text_model.h"
#include "remat/util/error.h"

namespace remat::encoders {
namespace {

constexpr const char* kClipComponent = "clip";

std::string where(const std::string& origin) { return std::string("[clip] ") + origin + ": "; }

// parse_config_json does not know the file; its message (which starts with "[clip] ") is
// re-thrown with the origin in front.
[[noreturn]] void rethrow_with_origin(const c10::ValueError& e, const std::string& origin) {
  std::string message = e.what_without_backtrace();
  const std::string tag = "[clip] ";
  if (message.compare(0, tag.size(), tag) == 0) message.erase(0, tag.size());
  throw_value_error(where(origin) + message);
}

// The keys of transformers' models/clip/configuration_clip.py (CLIPTextConfig) that remat reads
// and writes back (Note [Config fields] in config_json.h).
constexpr auto clip_text_fields = [](auto& c, auto&& field) {
  field("vocab_size", c.vocab_size);
  field("hidden_size", c.hidden_size);
  field("intermediate_size", c.intermediate_size);
  field("num_hidden_layers", c.num_hidden_layers);
  field("num_attention_heads", c.num_attention_heads);
  field("max_position_embeddings", c.max_position_embeddings);
  field("bos_token_id", c.bos_token_id);
  field("eos_token_id", c.eos_token_id);
  field("pad_token_id", c.pad_token_id);
  field("projection_dim", c.projection_dim);
  field("hidden_act", c.hidden_act);
  field("layer_norm_eps", c.layer_norm_eps);
};

void require_positive(int64_t value, const char* key, const std::string& origin) {
  if (value <= 0) {
    throw_value_error(where(origin) + key + " must be positive, got " + std::to_string(value));
  }
}

}  // namespace

ClipTextConfig ClipTextConfig::clip_l() { return ClipTextConfig{}; }

ClipTextConfig ClipTextConfig::tiny() {
  ClipTextConfig config;
  config.vocab_size = 732;  // write_tiny_clip_tokenizer: 512 byte symbols + 218 merges + 2 specials
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 2;
  config.max_position_embeddings = 77;
  config.bos_token_id = 730;
  config.eos_token_id = 731;
  config.pad_token_id = 731;
  config.projection_dim = 32;
  return config;
}

void ClipTextConfig::validate(const std::string& origin) const {
  require_positive(vocab_size, "vocab_size", origin);
  require_positive(hidden_size, "hidden_size", origin);
  require_positive(intermediate_size, "intermediate_size", origin);
  require_positive(num_hidden_layers, "num_hidden_layers", origin);
  require_positive(num_attention_heads, "num_attention_heads", origin);
  require_positive(max_position_embeddings, "max_position_embeddings", origin);
  // Bounds that no CLIP comes near; they keep parameter_count() and allocation sizes in int64.
  if (vocab_size > (int64_t{1} << 24) || hidden_size > 65536 || intermediate_size > 262144 ||
      num_hidden_layers > 1024 || max_position_embeddings > 65536) {
    throw_value_error(where(origin) +
                      "vocab_size <= 16777216, hidden_size <= 65536, intermediate_size <= 262144, "
                      "num_hidden_layers <= 1024 and max_position_embeddings <= 65536 are required");
  }
  if (hidden_size % num_attention_heads != 0) {
    throw_value_error(where(origin) + "hidden_size must be divisible by num_attention_heads, got " +
                      std::to_string(hidden_size) + " and " + std::to_string(num_attention_heads));
  }
  if (hidden_act != "quick_gelu" && hidden_act != "gelu") {
    throw_value_error(where(origin) + "hidden_act must be one of quick_gelu, gelu, got '" +
                      hidden_act + "'");
  }
  if (!(layer_norm_eps > 0.0) || !std::isfinite(layer_norm_eps)) {
    throw_value_error(where(origin) + "layer_norm_eps must be a positive finite number, got " +
                      std::to_string(layer_norm_eps));
  }
}

ClipTextConfig ClipTextConfig::from_json_text(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = remat::detail::parse_config_json(text, kClipComponent);
  } catch (const c10::ValueError& e) {
    rethrow_with_origin(e, origin);
  }
  ClipTextConfig config;
  clip_text_fields(config, remat::detail::ConfigFieldReader(j, where(origin)));
  config.validate(origin);
  return config;
}

ClipTextConfig ClipTextConfig::from_file(const std::string& path) {
  return from_json_text(remat::detail::read_text_file(path, kClipComponent), "'" + path + "'");
}

std::string ClipTextConfig::to_json() const {
  // Key names and the constant fields are those transformers' CLIPTextConfig.to_json_string
  // writes for a CLIPTextModel, so the file loads there as well; nlohmann::json sorts the keys as
  // to_json_string does.
  nlohmann::json j;
  j["architectures"] = {"CLIPTextModel"};
  j["attention_dropout"] = 0.0;
  j["dropout"] = 0.0;
  j["initializer_factor"] = 1.0;
  j["initializer_range"] = 0.02;
  j["model_type"] = "clip_text_model";
  clip_text_fields(*this, remat::detail::ConfigFieldWriter{j});
  return j.dump(2) + "\n";
}

bool operator==(const ClipTextConfig& a, const ClipTextConfig& b) {
  return remat::detail::same_fields(a, b, clip_text_fields);
}

int64_t parameter_count(const ClipTextConfig& config) {
  config.validate();
  const int64_t V = config.vocab_size, D = config.hidden_size, F = config.intermediate_size;
  const int64_t P = config.max_position_embeddings, L = config.num_hidden_layers;
  const int64_t attention = 4 * (D * D + D);
  const int64_t norms = 2 * 2 * D;
  const int64_t mlp = (D * F + F) + (F * D + D);
  return V * D + P * D + L * (attention + norms + mlp) + 2 * D;
}

}  // namespace remat::encoders
