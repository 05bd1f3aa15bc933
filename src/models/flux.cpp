#include "transformer_constants.h"
#include "remat/models/flux.h"
#include "remat/models/config_limits.h"
#include "remat/util/error.h"

#include <numeric>
#include <stdexcept>

#include <torch/torch.h>

#include "config_json.h"

namespace remat::models {

namespace {

constexpr const char* kFluxComponent = "FluxConfig";

// The keys of diffusers' models/transformers/transformer_flux.py (FluxTransformer2DModel.__init__)
// that define the architecture (Note [Config fields] in config_json.h); out_channels, which may
// be null, is read by hand in from_json_string.
constexpr auto flux_fields = [](auto& c, auto&& field) {
  field("patch_size", c.patch_size);
  field("in_channels", c.in_channels);
  field("num_layers", c.num_layers);
  field("num_single_layers", c.num_single_layers);
  field("attention_head_dim", c.attention_head_dim);
  field("num_attention_heads", c.num_attention_heads);
  field("joint_attention_dim", c.joint_attention_dim);
  field("pooled_projection_dim", c.pooled_projection_dim);
  field("guidance_embeds", c.guidance_embeds);
  field("axes_dims_rope", c.axes_dims_rope);
};

// Parameters of one Linear(in -> out) with bias.
int64_t linear_params(int64_t in, int64_t out) { return in * out + out; }

// Accepts (N, 3) or (B, N, 3) (diffusers takes [0] of a 3-D tensor, with a deprecation warning).
at::Tensor ids_2d(const at::Tensor& ids, const char* name) {
  TORCH_CHECK_VALUE(ids.dim() == 2 || ids.dim() == 3, "[flux] ", name,
                    " must be (N, 3) or (B, N, 3), got shape ", ids.sizes());
  return ids.dim() == 3 ? ids.select(0, 0) : ids;
}

// diffusers: samples[i // ceil(num_blocks / len)].
int64_t controlnet_interval(int64_t num_blocks, size_t num_samples) {
  const auto n = static_cast<int64_t>(num_samples);
  return (num_blocks + n - 1) / n;
}

}  // namespace

void FluxConfig::validate() const {
  // Each field is in its range before any product of fields is formed (config_limits.h).
  const auto in_range = [](const char* name, int64_t value, int64_t low, int64_t high) {
    TORCH_CHECK_VALUE(value >= low && value <= high, "[flux] ", name, " must be in [", low, ", ", high,
                      "], got ", value);
  };
  in_range("patch_size", patch_size, 1, kMaxConfigPatchSize);
  in_range("in_channels", in_channels, 1, kMaxConfigWidth);
  in_range("out_channels", output_channels(), 1, kMaxConfigWidth);
  in_range("num_layers", num_layers, 0, kMaxConfigBlocks);
  in_range("num_single_layers", num_single_layers, 0, kMaxConfigBlocks);
  in_range("attention_head_dim", attention_head_dim, 2, kMaxConfigWidth);
  TORCH_CHECK_VALUE(attention_head_dim % 2 == 0, "[flux] attention_head_dim must be even and >= 2, got ",
                    attention_head_dim);
  in_range("num_attention_heads", num_attention_heads, 1, kMaxConfigWidth);
  TORCH_CHECK_VALUE(num_attention_heads * attention_head_dim <= kMaxConfigWidth,
                    "[flux] the hidden size num_attention_heads x attention_head_dim must be at most ",
                    kMaxConfigWidth, ", got ", num_attention_heads, " x ", attention_head_dim);
  in_range("joint_attention_dim", joint_attention_dim, 1, kMaxConfigWidth);
  in_range("pooled_projection_dim", pooled_projection_dim, 1, kMaxConfigWidth);
  for (int64_t d : axes_dims_rope) {
    TORCH_CHECK_VALUE(d >= 2 && d % 2 == 0 && d <= attention_head_dim,
                      "[flux] axes_dims_rope entries must be even and in [2, attention_head_dim = ",
                      attention_head_dim, "], got ", axes_dims_rope);
  }
  const int64_t rope_sum = std::accumulate(axes_dims_rope.begin(), axes_dims_rope.end(), int64_t{0});
  TORCH_CHECK_VALUE(rope_sum == attention_head_dim,
                    "[flux] axes_dims_rope must sum to attention_head_dim (", attention_head_dim,
                    "), got ", axes_dims_rope);
}

std::vector<std::string> FluxConfig::preset_names() {
  return {"flux-dev", "flux-schnell", "flux-tiny", "flux-small"};
}

FluxConfig FluxConfig::preset(const std::string& name) {
  FluxConfig config;
  if (name == "flux-dev") return config;
  if (name == "flux-schnell") {
    config.guidance_embeds = false;
    return config;
  }
  if (name == "flux-tiny") {
    config.num_layers = 2;
    config.num_single_layers = 2;
    config.num_attention_heads = 2;
    config.attention_head_dim = 32;
    config.axes_dims_rope = {8, 12, 12};
    config.joint_attention_dim = 32;
    config.pooled_projection_dim = 16;
    return config;
  }
  if (name == "flux-small") {
    config.num_layers = 4;
    config.num_single_layers = 8;
    config.num_attention_heads = 2;
    config.attention_head_dim = 64;
    config.axes_dims_rope = {16, 24, 24};
    config.joint_attention_dim = 64;
    config.pooled_projection_dim = 32;
    return config;
  }
  std::string valid;
  for (const auto& n : preset_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw_value_error("[flux] preset must be one of " + valid + ", got '" + name + "'");
}

FluxConfig FluxConfig::from_json_string(const std::string& json) {
  const auto j = remat::detail::parse_config_json(json, kFluxComponent);
  FluxConfig config;
  const remat::detail::ConfigFieldReader field(j, std::string("[") + kFluxComponent + "] ");
  flux_fields(config, field);
  // out_channels: null (or absent, or -1) means in_channels.
  int64_t out = -1;
  field("out_channels", out);
  if (out != -1) config.out_channels = out;
  config.validate();
  return config;
}

FluxConfig FluxConfig::from_json_file(const std::string& path) {
  return remat::detail::parse_config_file(path, kFluxComponent, [](const std::string& text) { return from_json_string(text); });
}

FluxConfig FluxConfig::from_json(const std::string& path_or_json) {
  return remat::detail::looks_like_json(path_or_json) ? from_json_string(path_or_json)
                                               : from_json_file(path_or_json);
}

int64_t parameter_count(const FluxConfig& config) {
  config.validate();
  const int64_t D = config.hidden_size(), F = kMlpRatio * D, d = config.attention_head_dim;
  const int64_t out = config.patch_size * config.patch_size * config.output_channels();
  int64_t top = linear_params(config.in_channels, D) + linear_params(config.joint_attention_dim, D) +
                linear_params(kTimeChannels, D) + linear_params(D, D) +               // timestep
                linear_params(config.pooled_projection_dim, D) + linear_params(D, D) +  // text
                linear_params(D, 2 * D) + linear_params(D, out);                        // head
  if (config.guidance_embeds) top += linear_params(kTimeChannels, D) + linear_params(D, D);
  const int64_t ffn = linear_params(D, F) + linear_params(F, D);
  const int64_t double_block = 2 * linear_params(D, 6 * D) + 8 * linear_params(D, D) + 4 * d + 2 * ffn;
  const int64_t single_block = linear_params(D, 3 * D) + 3 * linear_params(D, D) + 2 * d +
                               linear_params(D, F) + linear_params(D + F, D);
  return top + config.num_layers * double_block + config.num_single_layers * single_block;
}

int64_t state_dict_key_count(const FluxConfig& config) {
  config.validate();
  const int64_t top = config.guidance_embeds ? 20 : 16;
  return top + 32 * config.num_layers + 14 * config.num_single_layers;
}

FluxImpl::FluxImpl(FluxConfig config) : config_(std::move(config)) {
  config_.validate();
  const int64_t D = config_.hidden_size(), H = config_.num_attention_heads;
  x_embedder = register_module("x_embedder", Linear(config_.in_channels, D));
  time_text_embed = register_module("time_text_embed", std::make_shared<torch::nn::Module>());
  timestep_embedder =
      time_text_embed->register_module("timestep_embedder", MlpEmbedder(kTimeChannels, D));
  if (config_.guidance_embeds) {
    guidance_embedder =
        time_text_embed->register_module("guidance_embedder", MlpEmbedder(kTimeChannels, D));
  }
  text_embedder = time_text_embed->register_module(
      "text_embedder", MlpEmbedder(config_.pooled_projection_dim, D));
  context_embedder = register_module("context_embedder", Linear(config_.joint_attention_dim, D));

  auto doubles = register_module("transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    transformer_blocks.emplace_back(D, H);
    doubles->push_back(transformer_blocks.back());
  }
  auto singles = register_module("single_transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_single_layers; ++i) {
    single_transformer_blocks.emplace_back(D, H, kMlpRatio);
    singles->push_back(single_transformer_blocks.back());
  }
  norm_out = register_module("norm_out", AdaLayerNormContinuous(D));
  proj_out = register_module(
      "proj_out", Linear(D, config_.patch_size * config_.patch_size * config_.output_channels()));
}

void FluxImpl::set_checkpoint_plan(CheckpointPlan plan) {
  plan.validate();
  if (!plan.stack_layouts.empty()) {
    if (plan.stack_layouts.size() != 2) {
      throw_value_error("[flux] checkpoint plan needs 2 layouts (double and single block stacks), got " +
                        std::to_string(plan.stack_layouts.size()));
    }
    validate_layout(plan.stack_layouts[0], config_.num_layers);
    validate_layout(plan.stack_layouts[1], config_.num_single_layers);
  }
  checkpointing_ = std::move(plan);
}

int64_t FluxImpl::set_block_swap(int64_t blocks_to_swap, std::optional<at::Device> device) {
  std::vector<std::shared_ptr<torch::nn::Module>> blocks;
  for (const auto& b : transformer_blocks) blocks.push_back(b.ptr());
  for (const auto& b : single_transformer_blocks) blocks.push_back(b.ptr());
  return replace_block_swap(*this, block_swap_, blocks, {config_.num_layers, config_.num_single_layers},
                            blocks_to_swap, device, x_embedder->weight_device());
}

at::Tensor FluxImpl::time_text_embedding(const at::Tensor& timestep,
                                         const std::optional<at::Tensor>& guidance,
                                         const at::Tensor& pooled_projections, at::ScalarType dtype) {
  // diffusers multiplies by 1000 in the activation dtype (bf16 rounding included), then builds the
  // sinusoid in float32 and casts it to the dtype of the pooled projections.
  const auto embed_dtype = pooled_projections.scalar_type();
  at::Tensor temb = timestep_embedder->forward(
      flux_timestep_projection(timestep.to(dtype) * 1000, kTimeChannels).to(embed_dtype));
  if (config_.guidance_embeds) {
    temb = temb + guidance_embedder->forward(
                      flux_timestep_projection(guidance->to(dtype) * 1000, kTimeChannels).to(embed_dtype));
  }
  return temb + text_embedder->forward(pooled_projections);
}

at::Tensor FluxImpl::forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                             const at::Tensor& pooled_projections, const at::Tensor& timestep,
                             const at::Tensor& img_ids_in, const at::Tensor& txt_ids_in,
                             const std::optional<at::Tensor>& guidance,
                             const std::vector<at::Tensor>& controlnet_block_samples,
                             const std::vector<at::Tensor>& controlnet_single_block_samples) {
  TORCH_CHECK_VALUE(hidden_states.dim() == 3 && hidden_states.size(2) == config_.in_channels,
                    "[flux] hidden_states must be (B, N_i, ", config_.in_channels, "), got shape ",
                    hidden_states.sizes());
  const int64_t B = hidden_states.size(0), n_img = hidden_states.size(1);
  TORCH_CHECK_VALUE(encoder_hidden_states.dim() == 3 && encoder_hidden_states.size(0) == B &&
                        encoder_hidden_states.size(2) == config_.joint_attention_dim,
                    "[flux] encoder_hidden_states must be (", B, ", N_t, ", config_.joint_attention_dim,
                    "), got shape ", encoder_hidden_states.sizes());
  TORCH_CHECK_VALUE(pooled_projections.dim() == 2 && pooled_projections.size(0) == B &&
                        pooled_projections.size(1) == config_.pooled_projection_dim,
                    "[flux] pooled_projections must be (", B, ", ", config_.pooled_projection_dim,
                    "), got shape ", pooled_projections.sizes());
  TORCH_CHECK_VALUE(timestep.dim() == 1 && timestep.size(0) == B, "[flux] timestep must be (", B,
                    "), got shape ", timestep.sizes());
  if (config_.guidance_embeds) {
    TORCH_CHECK_VALUE(guidance.has_value() && guidance->defined() && guidance->dim() == 1 &&
                          guidance->size(0) == B,
                      "[flux] guidance must be a (", B, ") tensor for a guidance-distilled model (guidance_embeds)");
  } else {
    TORCH_CHECK_VALUE(!guidance.has_value() || !guidance->defined(),
                      "[flux] guidance must be omitted when guidance_embeds is false");
  }
  const int64_t n_txt = encoder_hidden_states.size(1);
  const at::Tensor img_ids = ids_2d(img_ids_in, "img_ids");
  const at::Tensor txt_ids = ids_2d(txt_ids_in, "txt_ids");
  TORCH_CHECK_VALUE(img_ids.size(0) == n_img && img_ids.size(1) == 3, "[flux] img_ids must be (",
                    n_img, ", 3), got shape ", img_ids.sizes());
  TORCH_CHECK_VALUE(txt_ids.size(0) == n_txt && txt_ids.size(1) == 3, "[flux] txt_ids must be (",
                    n_txt, ", 3), got shape ", txt_ids.sizes());
  for (const auto* samples : {&controlnet_block_samples, &controlnet_single_block_samples}) {
    for (const auto& r : *samples) {
      TORCH_CHECK_VALUE(r.dim() == 3 && r.size(0) == B && r.size(1) == n_img &&
                            r.size(2) == config_.hidden_size(),
                        "[flux] controlnet samples must be (", B, ", ", n_img, ", ",
                        config_.hidden_size(), "), got shape ", r.sizes());
    }
  }

  at::Tensor x = x_embedder->forward(hidden_states);
  const auto dtype = x.scalar_type();
  const at::Tensor temb = time_text_embedding(timestep, guidance, pooled_projections, dtype);
  at::Tensor c = context_embedder->forward(encoder_hidden_states);
  const RotaryTables rope = flux_rope_tables(
      at::cat({txt_ids.to(x.device()), img_ids.to(x.device())}, 0), config_.axes_dims_rope, kRopeTheta);

  const bool active = checkpointing_.active(is_training());
  bool layer_scope = active && !checkpointing_.ffn_scope();
  const bool ffn_scope = active && checkpointing_.ffn_scope();
  const Backend ffn_backend = checkpointing_.backend();
  std::vector<Layout> layouts;
  if (layer_scope) {
    layouts = {checkpointing_.layout_for(0, config_.num_layers), checkpointing_.layout_for(1, config_.num_single_layers)};
  }
  // Streamed blocks run as checkpoints while autograd records (see remat/models/block_swap.h);
  // their FFN is then inside the block's checkpoint and not checkpointed again.
  const auto swap = block_swap_;
  const bool recording = torch::autograd::GradMode::is_enabled();
  const std::optional<SavedTensorOffload> offload_attention =
      is_training() && recording ? attention_offload_ : std::nullopt;
  if (swap) {
    if (recording && layouts.empty()) {
      layouts = {layout_keep_all(config_.num_layers), layout_keep_all(config_.num_single_layers)};
    }
    layouts = swap->prepare(std::move(layouts), recording);
    layer_scope = !layouts.empty();
  }
  const int64_t num_layers = config_.num_layers;
  // Which blocks checkpoint their FFN (SimpleTuner's per-block path: k % interval == 0).
  auto ffn_for = [ffn_scope, ffn_backend, gc = checkpointing_, swap, recording](
                     int64_t k, int64_t global) -> std::optional<Backend> {
    if (swap && recording && swap->streamed(global)) return std::nullopt;
    if (ffn_scope && gc.ffn_block_selected(k)) return ffn_backend;
    return std::nullopt;
  };

  // Per-block context (temb, rope, residuals, block holders) is captured by value: segments keep
  // these closures until backward.
  const auto doubles = transformer_blocks;
  const auto cn_double = controlnet_block_samples;
  const int64_t cn_double_every =
      cn_double.empty() ? 1 : controlnet_interval(config_.num_layers, cn_double.size());
  const RunBlock run_double = [doubles, temb, rope, cn_double, cn_double_every, ffn_for, swap, offload_attention](
                                  int64_t k, const Tensors& state) -> Tensors {
    if (swap) swap->use(k);
    auto [c_out, x_out] =
        doubles[k].ptr()->forward(state[0], state[1], temb, rope, ffn_for(k, k), offload_attention);
    if (!cn_double.empty()) x_out = x_out + cn_double[k / cn_double_every];
    return {x_out, c_out};
  };
  Tensors state{x, c};
  if (stage_observer_) stage_observer_("blocks_begin", state);
  if (layer_scope) {
    state = run_layout(layouts[0], state, run_double);
  } else {
    for (int64_t k = 0; k < config_.num_layers; ++k) state = run_double(k, state);
  }

  const auto singles = single_transformer_blocks;
  const auto cn_single = controlnet_single_block_samples;
  const int64_t cn_single_every =
      cn_single.empty() ? 1 : controlnet_interval(config_.num_single_layers, cn_single.size());
  const RunBlock run_single = [singles, temb, rope, cn_single, cn_single_every, ffn_for, n_txt, swap, num_layers,
                                offload_attention](int64_t k, const Tensors& st) -> Tensors {
    if (swap) swap->use(num_layers + k);
    at::Tensor s = singles[k].ptr()->forward(st[0], temb, rope, ffn_for(k, num_layers + k), offload_attention);
    if (!cn_single.empty()) {
      s = at::cat({s.narrow(1, 0, n_txt),
                   s.narrow(1, n_txt, s.size(1) - n_txt) + cn_single[k / cn_single_every]},
                  1);
    }
    return {s};
  };
  // The single stack works on the joint [text; image] sequence, concatenated once.
  Tensors joint{at::cat({state[1], state[0]}, 1)};
  // Nothing needs the double stack's output any more (cat saves no input): let it go now rather
  // than at return, so it is not live beside the single stack's activations.
  state.clear();
  if (layer_scope) {
    joint = run_layout(layouts[1], joint, run_single);
  } else {
    for (int64_t k = 0; k < config_.num_single_layers; ++k) joint = run_single(k, joint);
  }
  if (stage_observer_) stage_observer_("blocks_end", joint);
  x = joint[0].narrow(1, n_txt, n_img);

  const Modulation scale_shift = norm_out->forward(temb, dtype);  // scale first
  x = modulate(x, scale_shift[1].unsqueeze(1), scale_shift[0].unsqueeze(1));
  return proj_out->forward(x);
}

at::Tensor flux_pack_latents(const at::Tensor& latents) {
  TORCH_CHECK_VALUE(latents.dim() == 4 && latents.size(2) % 2 == 0 && latents.size(3) % 2 == 0,
                    "[flux_pack_latents] latents must be (B, C, h, w) with h and w even, got shape ",
                    latents.sizes());
  const int64_t B = latents.size(0), C = latents.size(1), h = latents.size(2), w = latents.size(3);
  return latents.view({B, C, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({B, (h / 2) * (w / 2), C * 4});
}

at::Tensor flux_unpack_latents(const at::Tensor& packed, int64_t height, int64_t width) {
  TORCH_CHECK_VALUE(height >= 2 && width >= 2 && height % 2 == 0 && width % 2 == 0,
                    "[flux_unpack_latents] height and width must be even and >= 2, got ", height,
                    "x", width);
  TORCH_CHECK_VALUE(packed.dim() == 3 && packed.size(1) == (height / 2) * (width / 2) &&
                        packed.size(2) % 4 == 0,
                    "[flux_unpack_latents] packed must be (B, ", (height / 2) * (width / 2),
                    ", 4C), got shape ", packed.sizes());
  const int64_t B = packed.size(0), C = packed.size(2) / 4;
  return packed.view({B, height / 2, width / 2, C, 2, 2})
      .permute({0, 3, 1, 4, 2, 5})
      .reshape({B, C, height, width});
}

at::Tensor flux_image_ids(int64_t packed_height, int64_t packed_width) {
  TORCH_CHECK_VALUE(packed_height >= 1 && packed_width >= 1,
                    "[flux_image_ids] packed grid must be at least 1x1, got ", packed_height, "x",
                    packed_width);
  at::Tensor ids = torch::zeros({packed_height, packed_width, 3});
  ids.select(2, 1).copy_(torch::arange(packed_height, at::kFloat).unsqueeze(1).expand({packed_height, packed_width}));
  ids.select(2, 2).copy_(torch::arange(packed_width, at::kFloat).unsqueeze(0).expand({packed_height, packed_width}));
  return ids.reshape({packed_height * packed_width, 3});
}

at::Tensor flux_reference_ids(int64_t packed_height, int64_t packed_width) {
  at::Tensor ids = flux_image_ids(packed_height, packed_width);
  ids.select(1, 0).fill_(1);
  return ids;
}

at::Tensor flux_text_ids(int64_t num_tokens) {
  TORCH_CHECK_VALUE(num_tokens >= 0, "[flux_text_ids] num_tokens must be >= 0, got ", num_tokens);
  return torch::zeros({num_tokens, 3});
}

}  // namespace remat::models
