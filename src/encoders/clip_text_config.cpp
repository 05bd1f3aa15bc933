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

// The shared config helpers do not know the file; their message (which starts with "[clip] ")
// is re-thrown with the origin in front.
[[noreturn]] void rethrow_with_origin(const c10::ValueError& e, const std::string& origin) {
  std::string message = e.what_without_backtrace();
  const std::string tag = "[clip] ";
  if (message.compare(0, tag.size(), tag) == 0) message.erase(0, tag.size());
  throw_value_error(where(origin) + message);
}

void read_string(const nlohmann::json& j, const char* key, std::string& out,
                 const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_string()) {
    throw_value_error(where(origin) + "config key '" + key + "' must be a string, got " +
                      util::json_excerpt(*it));
  }
  out = it->get<std::string>();
}

void read_clip_number(const nlohmann::json& j, const char* key, double& out, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_number()) {
    throw_value_error(where(origin) + "config key '" + key + "' must be a number, got " +
                      util::json_excerpt(*it));
  }
  out = it->get<double>();
}

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
  auto read_int = [&](const char* key, int64_t& out) {
    try {
      remat::detail::read_int(j, key, out, kClipComponent);
    } catch (const c10::ValueError& e) {
      rethrow_with_origin(e, origin);
    }
  };
  read_int("vocab_size", config.vocab_size);
  read_int("hidden_size", config.hidden_size);
  read_int("intermediate_size", config.intermediate_size);
  read_int("num_hidden_layers", config.num_hidden_layers);
  read_int("num_attention_heads", config.num_attention_heads);
  read_int("max_position_embeddings", config.max_position_embeddings);
  read_int("bos_token_id", config.bos_token_id);
  read_int("eos_token_id", config.eos_token_id);
  read_int("pad_token_id", config.pad_token_id);
  read_int("projection_dim", config.projection_dim);
  read_string(j, "hidden_act", config.hidden_act, origin);
  read_clip_number(j, "layer_norm_eps", config.layer_norm_eps, origin);
  config.validate(origin);
  return config;
}

ClipTextConfig ClipTextConfig::from_file(const std::string& path) {
  return from_json_text(remat::detail::read_text_file(path, kClipComponent), "'" + path + "'");
}

std::string ClipTextConfig::to_json() const {
  // Key names and the constant fields are those transformers' CLIPTextConfig.to_json_string
  // writes for a CLIPTextModel, so the file loads there as well.
  nlohmann::ordered_json j;
  j["architectures"] = {"CLIPTextModel"};
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = bos_token_id;
  j["dropout"] = 0.0;
  j["eos_token_id"] = eos_token_id;
  j["hidden_act"] = hidden_act;
  j["hidden_size"] = hidden_size;
  j["initializer_factor"] = 1.0;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = intermediate_size;
  j["layer_norm_eps"] = layer_norm_eps;
  j["max_position_embeddings"] = max_position_embeddings;
  j["model_type"] = "clip_text_model";
  j["num_attention_heads"] = num_attention_heads;
  j["num_hidden_layers"] = num_hidden_layers;
  j["pad_token_id"] = pad_token_id;
  j["projection_dim"] = projection_dim;
  j["vocab_size"] = vocab_size;
  return j.dump(2) + "\n";
}

bool operator==(const ClipTextConfig& a, const ClipTextConfig& b) {
  return a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size &&
         a.intermediate_size == b.intermediate_size && a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.max_position_embeddings == b.max_position_embeddings && a.hidden_act == b.hidden_act &&
         a.layer_norm_eps == b.layer_norm_eps && a.bos_token_id == b.bos_token_id &&
         a.eos_token_id == b.eos_token_id && a.pad_token_id == b.pad_token_id &&
         a.projection_dim == b.projection_dim;
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
