// The Linear layers of each model, from its config alone (no allocation), and the LoRA parameter
// count over them: what memory admission needs to size a LoRA run before building the model.
// tests/models/lora_test.cpp checks each list against the Linear modules of a built model.
#include <string>
#include <vector>

#include "transformer_constants.h"
#include "remat/util/error.h"
#include "remat/models/flux.h"
#include "remat/models/lora.h"
#include "remat/models/mageflow.h"

namespace remat::models {
namespace {


class Layers {
 public:
  void add(const std::string& name, int64_t in, int64_t out) { out_.push_back({name, in, out}); }
  // diffusers' FeedForward: net.0.proj (D -> 4D), net.2 (4D -> D).
  void feed_forward(const std::string& prefix, int64_t dim) {
    add(prefix + ".net.0.proj", dim, kMlpRatio * dim);
    add(prefix + ".net.2", kMlpRatio * dim, dim);
  }
  // blocks.cpp AttentionImpl: q, k, v, and with a context stream its projections and output.
  void attention(const std::string& prefix, int64_t dim, bool context, bool output) {
    for (const char* name : {"to_q", "to_k", "to_v"}) add(prefix + "." + name, dim, dim);
    if (context) {
      for (const char* name : {"add_q_proj", "add_k_proj", "add_v_proj"}) add(prefix + "." + name, dim, dim);
    }
    if (output) add(prefix + ".to_out.0", dim, dim);
    if (context) add(prefix + ".to_add_out", dim, dim);
  }
  std::vector<LinearShape> take() { return std::move(out_); }

 private:
  std::vector<LinearShape> out_;
};

}  // namespace

std::vector<LinearShape> linear_layers(const FluxConfig& config) {
  config.validate();
  const int64_t D = config.hidden_size();
  Layers l;
  l.add("x_embedder", config.in_channels, D);
  l.add("time_text_embed.timestep_embedder.linear_1", kTimeChannels, D);
  l.add("time_text_embed.timestep_embedder.linear_2", D, D);
  if (config.guidance_embeds) {
    l.add("time_text_embed.guidance_embedder.linear_1", kTimeChannels, D);
    l.add("time_text_embed.guidance_embedder.linear_2", D, D);
  }
  l.add("time_text_embed.text_embedder.linear_1", config.pooled_projection_dim, D);
  l.add("time_text_embed.text_embedder.linear_2", D, D);
  l.add("context_embedder", config.joint_attention_dim, D);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string p = "transformer_blocks." + std::to_string(i);
    l.add(p + ".norm1.linear", D, 6 * D);
    l.add(p + ".norm1_context.linear", D, 6 * D);
    l.attention(p + ".attn", D, /*context=*/true, /*output=*/true);
    l.feed_forward(p + ".ff", D);
    l.feed_forward(p + ".ff_context", D);
  }
  for (int64_t i = 0; i < config.num_single_layers; ++i) {
    const std::string p = "single_transformer_blocks." + std::to_string(i);
    l.add(p + ".norm.linear", D, 3 * D);
    l.attention(p + ".attn", D, /*context=*/false, /*output=*/false);
    l.add(p + ".proj_mlp", D, kMlpRatio * D);
    l.add(p + ".proj_out", D + kMlpRatio * D, D);
  }
  l.add("norm_out.linear", D, 2 * D);
  l.add("proj_out", D, config.patch_size * config.patch_size * config.output_channels());
  return l.take();
}

std::vector<LinearShape> linear_layers(const MageFlowConfig& config) {
  config.validate();
  const int64_t D = config.hidden_size;
  Layers l;
  l.add("img_in", config.in_channels, D);
  l.add("txt_in", config.context_in_dim, D);
  l.add("time_text_embed.timestep_embedder.linear_1", kTimeChannels, D);
  l.add("time_text_embed.timestep_embedder.linear_2", D, D);
  for (int64_t i = 0; i < config.depth; ++i) {
    const std::string p = "transformer_blocks." + std::to_string(i);
    l.add(p + ".img_mod.1", D, 6 * D);
    l.add(p + ".txt_mod.1", D, 6 * D);
    l.attention(p + ".attn", D, /*context=*/true, /*output=*/true);
    l.feed_forward(p + ".img_mlp", D);
    l.feed_forward(p + ".txt_mlp", D);
  }
  l.add("norm_out.linear", D, 2 * D);
  l.add("proj_out", D, config.patch_size * config.patch_size * config.output_channels());
  return l.take();
}

int64_t lora_parameter_count(const std::vector<LinearShape>& layers,
                             const std::vector<std::string>& target_suffixes, int64_t rank) {
  if (rank < 1) throw_value_error("[lora] rank must be >= 1, got " + std::to_string(rank));
  int64_t total = 0;
  for (const auto& layer : layers) {
    for (const auto& suffix : target_suffixes) {
      if (!lora_target_matches(layer.name, suffix)) continue;
      // lora_A (rank, in) + lora_B (out, rank), as LinearImpl::enable_lora registers them.
      int64_t count = 0;
      if (__builtin_add_overflow(layer.in_features, layer.out_features, &count) ||
          __builtin_mul_overflow(count, rank, &count) || __builtin_add_overflow(total, count, &total)) {
        throw_value_error("[lora] rank " + std::to_string(rank) + " makes the LoRA parameter count overflow int64");
      }
      break;
    }
  }
  return total;
}

}  // namespace remat::models
