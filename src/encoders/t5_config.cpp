#include "remat/encoders/t5_config.h"

#include <nlohmann/json.hpp>

#include "config_json.h"
#include <c10/util/Exception.h>

#include "remat/util/error.h"

// The fields and defaults of transformers' models/t5/configuration_t5.py (T5Config).

namespace remat::encoders {
namespace {

constexpr const char* kT5ConfigComponent = "t5";

// The keys of transformers' models/t5/configuration_t5.py (T5Config) read and written as they are
// (Note [Config fields] in config_json.h); from_json_text adds the derived defaults by hand.
constexpr auto t5_fields = [](auto& c, auto&& field) {
  field("vocab_size", c.vocab_size);
  field("d_model", c.d_model);
  field("d_kv", c.d_kv);
  field("d_ff", c.d_ff);
  field("num_layers", c.num_layers);
  field("num_decoder_layers", c.num_decoder_layers);
  field("num_heads", c.num_heads);
  field("relative_attention_num_buckets", c.relative_attention_num_buckets);
  field("relative_attention_max_distance", c.relative_attention_max_distance);
  field("pad_token_id", c.pad_token_id);
  field("eos_token_id", c.eos_token_id);
  field("layer_norm_epsilon", c.layer_norm_epsilon);
  field("dropout_rate", c.dropout_rate);
  field("feed_forward_proj", c.feed_forward_proj);
  field("dense_act_fn", c.dense_act_fn);
  field("is_gated_act", c.is_gated_act);
};

void check_positive(int64_t value, const char* key) {
  if (value <= 0) {
    throw_value_error(std::string("[t5] ") + key + " must be a positive integer, got " +
                      std::to_string(value));
  }
}

// Upper bounds, checked before anything is built (num_layers 100000 built layers until memory
// ran out): the largest published T5 encoders (t5-v1_1-xxl as in FLUX.1's text_encoder_2: d_model
// 4096, d_ff 10240, 24 layers, 64 heads; t5-11b: d_ff 65536, 128 heads, d_kv 128; umt5-xxl:
// vocabulary 256384) with a wide margin.
void check_at_most(int64_t value, int64_t bound, const char* key) {
  if (value > bound) {
    throw_value_error(std::string("[t5] ") + key + " must be at most " + std::to_string(bound) + " (the largest "
                      "published T5 encoders stay far below), got " + std::to_string(value));
  }
}

}  // namespace

void T5Config::derive_activation() {
  // transformers: split on '-'; "ACT" or "gated-ACT"; "gated-gelu" means gelu_new.
  const auto dash = feed_forward_proj.find('-');
  std::string act = feed_forward_proj;
  bool gated = false;
  if (dash != std::string::npos) {
    gated = feed_forward_proj.substr(0, dash) == "gated";
    act = feed_forward_proj.substr(dash + 1);
  }
  const bool valid_form = dash == std::string::npos || (gated && act.find('-') == std::string::npos);
  const bool known = act == "relu" || act == "gelu" || act == "gelu_new";
  if (!valid_form || !known) {
    throw_value_error("[t5] feed_forward_proj '" + feed_forward_proj +
                      "' is not supported; valid: relu, gelu, gelu_new, gated-relu, gated-gelu "
                      "(= gated gelu_new, T5 v1.1), gated-gelu_new");
  }
  dense_act_fn = feed_forward_proj == "gated-gelu" ? "gelu_new" : act;
  is_gated_act = gated;
}

void T5Config::validate() const {
  check_positive(vocab_size, "vocab_size");
  check_positive(d_model, "d_model");
  check_positive(d_kv, "d_kv");
  check_positive(d_ff, "d_ff");
  check_positive(num_layers, "num_layers");
  check_positive(num_heads, "num_heads");
  check_at_most(vocab_size, int64_t{1} << 20, "vocab_size");
  check_at_most(d_model, 16384, "d_model");
  check_at_most(d_kv, 1024, "d_kv");
  check_at_most(d_ff, 262144, "d_ff");
  check_at_most(num_layers, 128, "num_layers");
  check_at_most(num_heads, 512, "num_heads");
  check_at_most(relative_attention_num_buckets, 4096, "relative_attention_num_buckets");
  if (relative_attention_num_buckets < 4) {
    throw_value_error("[t5] relative_attention_num_buckets must be at least 4 (the encoder splits "
                      "them by direction, then into exact and log-spaced halves), got " +
                      std::to_string(relative_attention_num_buckets));
  }
  if (relative_attention_max_distance <= relative_attention_num_buckets / 4) {
    throw_value_error("[t5] relative_attention_max_distance must exceed relative_attention_num_buckets"
                      " / 4 = " + std::to_string(relative_attention_num_buckets / 4) + ", got " +
                      std::to_string(relative_attention_max_distance));
  }
  if (!(layer_norm_epsilon > 0.0)) {
    throw_value_error("[t5] layer_norm_epsilon must be > 0, got " + std::to_string(layer_norm_epsilon));
  }
  if (dense_act_fn != "relu" && dense_act_fn != "gelu" && dense_act_fn != "gelu_new") {
    throw_value_error("[t5] dense_act_fn '" + dense_act_fn + "' is not supported; valid: relu, gelu, gelu_new");
  }
}

T5Config T5Config::from_json_text(const std::string& json, const std::string& source) {
  // Every message below starts with "[t5] "; the source (the file) goes right after the tag.
  try {
    const auto j = remat::detail::parse_config_json(json, kT5ConfigComponent);
    T5Config c;
    const remat::detail::ConfigFieldReader field(j, "[t5] ");
    t5_fields(c, field);
    // By hand, as T5Config.__init__ does: num_decoder_layers defaults to num_layers (symmetry);
    // feed_forward_proj derives dense_act_fn and is_gated_act, and explicit keys override the
    // derived values, as PretrainedConfig's leftover kwargs do.
    if (!field.has("num_decoder_layers")) c.num_decoder_layers = c.num_layers;
    c.derive_activation();
    field("dense_act_fn", c.dense_act_fn);
    field("is_gated_act", c.is_gated_act);
    c.validate();
    return c;
  } catch (const c10::ValueError& e) {
    std::string message = e.what_without_backtrace();
    while (!message.empty() && message.back() == '\n') message.pop_back();
    const std::string tag = "[t5] ";
    if (message.rfind(tag, 0) == 0) message = message.substr(tag.size());
    throw_value_error(tag + source + ": " + message);
  }
}

T5Config T5Config::from_file(const std::string& path) {
  return from_json_text(remat::detail::read_text_file(path, kT5ConfigComponent), "'" + path + "'");
}

std::string T5Config::to_json() const {
  // nlohmann::json keeps its keys sorted, as transformers' to_json_string writes them.
  nlohmann::json j;
  j["architectures"] = {"T5EncoderModel"};
  j["decoder_start_token_id"] = 0;
  j["initializer_factor"] = 1.0;
  j["is_encoder_decoder"] = true;
  j["model_type"] = "t5";
  j["tie_word_embeddings"] = false;
  j["use_cache"] = true;
  t5_fields(*this, remat::detail::ConfigFieldWriter{j});
  return j.dump(2) + "\n";
}

T5Config T5Config::t5_v1_1_xxl() {
  T5Config c;
  c.vocab_size = 32128;
  c.d_model = 4096;
  c.d_kv = 64;
  c.d_ff = 10240;
  c.num_layers = 24;
  c.num_decoder_layers = 24;
  c.num_heads = 64;
  c.relative_attention_num_buckets = 32;
  c.relative_attention_max_distance = 128;
  c.layer_norm_epsilon = 1e-6;
  c.feed_forward_proj = "gated-gelu";
  c.derive_activation();
  return c;
}

T5Config T5Config::tiny() {
  T5Config c = t5_v1_1_xxl();
  c.vocab_size = 216;
  c.d_model = 32;
  c.d_kv = 8;
  c.d_ff = 64;
  c.num_layers = 2;
  c.num_decoder_layers = 2;
  c.num_heads = 4;
  return c;
}

bool operator==(const T5Config& a, const T5Config& b) {
  return remat::detail::same_fields(a, b, t5_fields);
}

int64_t parameter_count(const T5Config& config) {
  config.validate();
  const int64_t D = config.d_model, F = config.d_ff, inner = config.inner_dim();
  const int64_t ff = (config.is_gated_act ? 3 : 2) * D * F;
  const int64_t block = 4 * D * inner + ff + 2 * D;
  return config.vocab_size * D + config.num_layers * block +
         config.relative_attention_num_buckets * config.num_heads + D;
}

}  // namespace remat::encoders
