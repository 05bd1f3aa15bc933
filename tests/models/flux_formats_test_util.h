#pragma once
// Shared by the weight-format and LoRA-format tests: a random Flux model, one forward pass, and a
// diffusers -> Black Forest Labs converter written here from the published mapping (diffusers'
// convert_flux_transformer_checkpoint_to_diffusers read backwards), independent of the table in
// src/models/flux_weight_formats_table.cpp.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "remat/io/safetensors.h"
#include "remat/models/flux.h"

namespace remat::models::test {

/// A Flux model with every parameter drawn from N(0, 0.1) (no zero-initialised layer, so a
/// mix-up of any two tensors changes the output).
inline Flux random_flux(const FluxConfig& config, uint64_t seed) {
  torch::manual_seed(seed);
  Flux model(config);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.copy_(torch::randn_like(p) * 0.1);
  return model;
}

/// One deterministic forward pass (batch 1, 2x2 packed image tokens, 3 text tokens).
inline at::Tensor forward_once(FluxImpl& model) {
  const auto& c = model.config();
  torch::manual_seed(1234);
  const auto x = torch::randn({1, 4, c.in_channels});
  const auto txt = torch::randn({1, 3, c.joint_attention_dim});
  const auto pooled = torch::randn({1, c.pooled_projection_dim});
  const auto t = torch::tensor({0.6f});
  std::optional<at::Tensor> guidance;
  if (c.guidance_embeds) guidance = torch::tensor({3.5f});
  torch::NoGradGuard no_grad;
  return model.forward(x, txt, pooled, t, flux_image_ids(2, 2), flux_text_ids(3), guidance);
}

/// The diffusers state dict of `model` by name (no LoRA factors).
inline std::map<std::string, at::Tensor> diffusers_state(const FluxImpl& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : io::module_state(model)) {
    if (name.find(".lora_") == std::string::npos) out[name] = t.detach().clone();
  }
  return out;
}

/// Black Forest Labs' layout of a diffusers Flux state dict, following diffusers' converter
/// backwards: q, k, v (and the single blocks' MLP input) concatenated along dim 0 and the final
/// modulation's (scale, shift) halves put back as (shift, scale).
inline std::vector<io::NamedTensor> test_diffusers_to_bfl(std::map<std::string, at::Tensor> sd,
                                                          const FluxConfig& config, const std::string& prefix = "") {
  std::vector<io::NamedTensor> out;
  const auto move = [&](const std::string& bfl, const std::string& diffusers) {
    out.emplace_back(prefix + bfl, sd.at(diffusers));
    sd.erase(diffusers);
  };
  const auto cat = [&](const std::string& bfl, const std::vector<std::string>& parts) {
    std::vector<at::Tensor> ts;
    for (const auto& p : parts) {
      ts.push_back(sd.at(p));
      sd.erase(p);
    }
    out.emplace_back(prefix + bfl, torch::cat(ts, 0));
  };
  for (const std::string wb : {"weight", "bias"}) {
    move("time_in.in_layer." + wb, "time_text_embed.timestep_embedder.linear_1." + wb);
    move("time_in.out_layer." + wb, "time_text_embed.timestep_embedder.linear_2." + wb);
    move("vector_in.in_layer." + wb, "time_text_embed.text_embedder.linear_1." + wb);
    move("vector_in.out_layer." + wb, "time_text_embed.text_embedder.linear_2." + wb);
    if (config.guidance_embeds) {
      move("guidance_in.in_layer." + wb, "time_text_embed.guidance_embedder.linear_1." + wb);
      move("guidance_in.out_layer." + wb, "time_text_embed.guidance_embedder.linear_2." + wb);
    }
    move("txt_in." + wb, "context_embedder." + wb);
    move("img_in." + wb, "x_embedder." + wb);
    for (int64_t i = 0; i < config.num_layers; ++i) {
      const std::string b = "double_blocks." + std::to_string(i) + ".";
      const std::string t = "transformer_blocks." + std::to_string(i) + ".";
      move(b + "img_mod.lin." + wb, t + "norm1.linear." + wb);
      move(b + "txt_mod.lin." + wb, t + "norm1_context.linear." + wb);
      cat(b + "img_attn.qkv." + wb, {t + "attn.to_q." + wb, t + "attn.to_k." + wb, t + "attn.to_v." + wb});
      cat(b + "txt_attn.qkv." + wb,
          {t + "attn.add_q_proj." + wb, t + "attn.add_k_proj." + wb, t + "attn.add_v_proj." + wb});
      move(b + "img_mlp.0." + wb, t + "ff.net.0.proj." + wb);
      move(b + "img_mlp.2." + wb, t + "ff.net.2." + wb);
      move(b + "txt_mlp.0." + wb, t + "ff_context.net.0.proj." + wb);
      move(b + "txt_mlp.2." + wb, t + "ff_context.net.2." + wb);
      move(b + "img_attn.proj." + wb, t + "attn.to_out.0." + wb);
      move(b + "txt_attn.proj." + wb, t + "attn.to_add_out." + wb);
    }
    for (int64_t i = 0; i < config.num_single_layers; ++i) {
      const std::string b = "single_blocks." + std::to_string(i) + ".";
      const std::string t = "single_transformer_blocks." + std::to_string(i) + ".";
      move(b + "modulation.lin." + wb, t + "norm.linear." + wb);
      cat(b + "linear1." + wb, {t + "attn.to_q." + wb, t + "attn.to_k." + wb, t + "attn.to_v." + wb, t + "proj_mlp." + wb});
      move(b + "linear2." + wb, t + "proj_out." + wb);
    }
    move("final_layer.linear." + wb, "proj_out." + wb);
    const auto halves = sd.at("norm_out.linear." + wb).chunk(2, 0);  // (scale, shift)
    out.emplace_back(prefix + "final_layer.adaLN_modulation.1." + wb, torch::cat({halves[1], halves[0]}, 0));
    sd.erase("norm_out.linear." + wb);
  }
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string b = "double_blocks." + std::to_string(i) + ".";
    const std::string t = "transformer_blocks." + std::to_string(i) + ".attn.";
    move(b + "img_attn.norm.query_norm.scale", t + "norm_q.weight");
    move(b + "img_attn.norm.key_norm.scale", t + "norm_k.weight");
    move(b + "txt_attn.norm.query_norm.scale", t + "norm_added_q.weight");
    move(b + "txt_attn.norm.key_norm.scale", t + "norm_added_k.weight");
  }
  for (int64_t i = 0; i < config.num_single_layers; ++i) {
    const std::string b = "single_blocks." + std::to_string(i) + ".norm.";
    const std::string t = "single_transformer_blocks." + std::to_string(i) + ".attn.";
    move(b + "query_norm.scale", t + "norm_q.weight");
    move(b + "key_norm.scale", t + "norm_k.weight");
  }
  EXPECT_TRUE(sd.empty()) << "the test converter left " << sd.size() << " diffusers keys, first "
                          << (sd.empty() ? "" : sd.begin()->first);
  return out;
}

}  // namespace remat::models::test
