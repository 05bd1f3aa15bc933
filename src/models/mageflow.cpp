#include "transformer_constants.h"
#include "remat/models/mageflow.h"
#include "remat/models/config_limits.h"
#include "remat/util/error.h"

#include <numeric>
#include <stdexcept>

#include <torch/nn/modules/activation.h>
#include <torch/torch.h>

#include "config_json.h"
#include "quantized_build.h"
#include "remat/models/quantized_loading.h"

namespace remat::models {

namespace {

constexpr const char* kMageFlowComponent = "MageFlowConfig";

// The keys of the MageFlow transformer's config.json (the wrapper constructor's names) that
// define the architecture (Note [Config fields] in config_json.h); out_channels, which may be
// null, is read by hand in from_json_string.
constexpr auto mageflow_fields = [](auto& c, auto&& field) {
  field("hidden_size", c.hidden_size);
  field("num_heads", c.num_heads);
  field("depth", c.depth);
  field("axes_dim", c.axes_dim);
  field("in_channels", c.in_channels);
  field("context_in_dim", c.context_in_dim);
  field("patch_size", c.patch_size);
};

int64_t linear_params(int64_t in, int64_t out) { return in * out + out; }

std::vector<int64_t> cu_to_vector(const at::Tensor& cu, const char* name) {
  TORCH_CHECK_VALUE(cu.dim() == 1 && cu.numel() >= 2 && !at::isFloatingType(cu.scalar_type()),
                    "[mageflow] ", name, " must be a 1-D integer tensor of n + 1 >= 2 entries, got ",
                    cu.scalar_type(), " shape ", cu.sizes());
  const at::Tensor c = cu.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> out(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  TORCH_CHECK_VALUE(out[0] == 0, "[mageflow] ", name, " must start at 0, got ", out[0]);
  for (size_t i = 1; i < out.size(); ++i) {
    TORCH_CHECK_VALUE(out[i] >= out[i - 1], "[mageflow] ", name, " must be non-decreasing, got ",
                      out[i - 1], " then ", out[i], " at index ", i);
  }
  return out;
}

// Tokens of one image, (frames, h, w) = (1, h, w), with the product checked: img_shapes come from
// files and callers, and a wrapped h * w (2^32 x 2^32 = 0 in int64) once passed the token check
// and then sized the RoPE tables.
int64_t image_tokens(const ImageShape& shape, size_t idx) {
  const auto [frames, h, w] = shape;
  TORCH_CHECK_VALUE(frames == 1, "[msrope] img_shapes[", idx, "] frames must be 1, got ", frames);
  TORCH_CHECK_VALUE(h >= 1 && w >= 1, "[msrope] img_shapes[", idx, "] h and w must be >= 1, got ", h,
                    "x", w);
  int64_t tokens = 0;
  TORCH_CHECK_VALUE(!__builtin_mul_overflow(h, w, &tokens), "[msrope] img_shapes[", idx, "] h x w = ", h,
                    " x ", w, " overflows int64");
  return tokens;
}

// Sample index of every token: (cu.back()) int64.
at::Tensor token_samples(const std::vector<int64_t>& cu, c10::Device device) {
  const int64_t n = static_cast<int64_t>(cu.size()) - 1;
  std::vector<int64_t> lengths(n);
  for (int64_t b = 0; b < n; ++b) lengths[b] = cu[b + 1] - cu[b];
  const at::Tensor counts = torch::tensor(lengths, at::kLong);
  return torch::arange(n, at::kLong).repeat_interleave(counts).to(device);
}

// (n, D) per-sample modulation -> (1, tokens, D) per token (the reference's repeat_interleave).
at::Tensor per_token(const at::Tensor& m, const at::Tensor& sample_index) {
  return m.index_select(0, sample_index).unsqueeze(0);
}

}  // namespace

void MageFlowConfig::validate() const {
  // Each field is in its range before any product of fields is formed (config_limits.h).
  const auto in_range = [](const char* name, int64_t value, int64_t low, int64_t high) {
    TORCH_CHECK_VALUE(value >= low && value <= high, "[mageflow] ", name, " must be in [", low, ", ",
                      high, "], got ", value);
  };
  in_range("hidden_size", hidden_size, 1, kMaxConfigWidth);
  in_range("num_heads", num_heads, 1, kMaxConfigWidth);
  TORCH_CHECK_VALUE(hidden_size % num_heads == 0,
                    "[mageflow] num_heads must divide hidden_size ", hidden_size, ", got ", num_heads);
  TORCH_CHECK_VALUE(head_dim() % 2 == 0, "[mageflow] head dim (hidden_size / num_heads) must be even, got ",
                    head_dim());
  in_range("depth", depth, 0, kMaxConfigBlocks);
  in_range("in_channels", in_channels, 1, kMaxConfigWidth);
  in_range("out_channels", output_channels(), 1, kMaxConfigWidth);
  in_range("context_in_dim", context_in_dim, 1, kMaxConfigWidth);
  in_range("patch_size", patch_size, 1, kMaxConfigPatchSize);
  TORCH_CHECK_VALUE(axes_dim.size() == 3, "[mageflow] axes_dim must have 3 entries (frame, height, width), got ",
                    axes_dim);
  for (int64_t d : axes_dim) {
    TORCH_CHECK_VALUE(d >= 2 && d % 2 == 0 && d <= head_dim(),
                      "[mageflow] axes_dim entries must be even and in [2, head dim = ", head_dim(), "], got ",
                      axes_dim);
  }
  const int64_t sum = std::accumulate(axes_dim.begin(), axes_dim.end(), int64_t{0});
  TORCH_CHECK_VALUE(sum == head_dim(), "[mageflow] axes_dim must sum to the head dim (", head_dim(),
                    "), got ", axes_dim);
}

std::vector<std::string> MageFlowConfig::preset_names() {
  return {"mageflow-4b", "mageflow-tiny", "mageflow-small"};
}

MageFlowConfig MageFlowConfig::preset(const std::string& name) {
  MageFlowConfig config;
  if (name == "mageflow-4b") return config;
  if (name == "mageflow-tiny") {
    config.hidden_size = 64;
    config.num_heads = 2;
    config.depth = 2;
    config.axes_dim = {8, 12, 12};
    config.context_in_dim = 32;
    return config;
  }
  if (name == "mageflow-small") {
    config.hidden_size = 128;
    config.num_heads = 2;
    config.depth = 6;
    config.axes_dim = {16, 24, 24};
    config.context_in_dim = 64;
    return config;
  }
  std::string valid;
  for (const auto& n : preset_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw_value_error("[mageflow] preset must be one of " + valid + ", got '" + name + "'");
}

MageFlowConfig MageFlowConfig::from_json_string(const std::string& json) {
  const auto j = remat::detail::parse_config_json(json, kMageFlowComponent);
  MageFlowConfig config;
  const remat::detail::ConfigFieldReader field(j, std::string("[") + kMageFlowComponent + "] ");
  mageflow_fields(config, field);
  // out_channels: null (or absent, or -1) means kDefaultOutChannels.
  int64_t out = -1;
  field("out_channels", out);
  if (out != -1) config.out_channels = out;
  config.validate();
  return config;
}

std::string MageFlowConfig::to_json() const {
  validate();
  nlohmann::ordered_json j;
  j["_class_name"] = "MageFlowTransformer2DModel";
  mageflow_fields(*this, [&](const char* key, const auto& value) { j[key] = value; });
  j["out_channels"] = output_channels();
  return j.dump(2) + "\n";
}

MageFlowConfig MageFlowConfig::from_json_file(const std::string& path) {
  return remat::detail::parse_config_file(path, kMageFlowComponent, [](const std::string& text) { return from_json_string(text); });
}

MageFlowConfig MageFlowConfig::from_json(const std::string& path_or_json) {
  return remat::detail::looks_like_json(path_or_json) ? from_json_string(path_or_json)
                                               : from_json_file(path_or_json);
}

int64_t parameter_count(const MageFlowConfig& config) {
  config.validate();
  const int64_t D = config.hidden_size, F = kMlpRatio * D, d = config.head_dim();
  const int64_t out = config.patch_size * config.patch_size * config.output_channels();
  const int64_t top = linear_params(config.in_channels, D) + config.context_in_dim +
                      linear_params(config.context_in_dim, D) + linear_params(kTimeChannels, D) +
                      linear_params(D, D) + linear_params(D, 2 * D) + linear_params(D, out);
  const int64_t block = 2 * linear_params(D, 6 * D) + 8 * linear_params(D, D) + 4 * d +
                        2 * (linear_params(D, F) + linear_params(F, D));
  return top + config.depth * block;
}

int64_t state_dict_key_count(const MageFlowConfig& config) {
  config.validate();
  return 13 + 32 * config.depth;
}

RotaryTables mageflow_rope_tables(const std::vector<ImageShape>& img_shapes,
                                  const std::vector<int64_t>& axes_dim, double theta) {
  TORCH_CHECK_VALUE(axes_dim.size() == 3, "[msrope] axes_dim must have 3 entries, got ", axes_dim);
  const auto f32 = torch::TensorOptions().dtype(at::kFloat);
  std::vector<at::Tensor> inv;
  for (int64_t dim : axes_dim) {
    // Vendored MageFlowEmbedRope: inverse frequencies in float32.
    inv.push_back(1.0 / torch::pow(theta, torch::arange(0, dim, 2, f32) / static_cast<double>(dim)));
  }
  std::vector<at::Tensor> angles;
  for (size_t idx = 0; idx < img_shapes.size(); ++idx) {
    const auto [frames, h, w] = img_shapes[idx];
    image_tokens(img_shapes[idx], idx);  // checks frames, h, w and that h * w fits
    // Centred positions: h = 4 -> -2..1, h = 5 -> -3..1.
    const at::Tensor rows = torch::arange(h, f32) - static_cast<double>((h + 1) / 2);
    const at::Tensor cols = torch::arange(w, f32) - static_cast<double>((w + 1) / 2);
    const at::Tensor frame = torch::full({h * w}, static_cast<double>(idx), f32);
    const at::Tensor r = rows.unsqueeze(1).expand({h, w}).reshape({h * w});
    const at::Tensor c = cols.unsqueeze(0).expand({h, w}).reshape({h * w});
    angles.push_back(at::cat({at::outer(frame, inv[0]), at::outer(r, inv[1]), at::outer(c, inv[2])}, 1));
  }
  TORCH_CHECK_VALUE(!angles.empty(), "[msrope] img_shapes must not be empty");
  const at::Tensor a = at::cat(angles, 0);
  return {at::cos(a).repeat_interleave(2, 1), at::sin(a).repeat_interleave(2, 1)};
}

PackedSamples PackedSamples::from_cu_seqlens(const at::Tensor& txt_cu_seqlens,
                                             const at::Tensor& img_cu_seqlens, c10::Device device,
                                             std::optional<int64_t> txt_tokens,
                                             std::optional<int64_t> img_tokens) {
  PackedSamples s;
  s.txt_cu = cu_to_vector(txt_cu_seqlens, "txt_cu_seqlens");
  s.img_cu = cu_to_vector(img_cu_seqlens, "img_cu_seqlens");
  TORCH_CHECK_VALUE(s.txt_cu.size() == s.img_cu.size(),
                    "[mageflow] txt_cu_seqlens and img_cu_seqlens must have the same length, got ",
                    s.txt_cu.size(), " and ", s.img_cu.size());
  // Before the per-token index tensors are allocated: their size is the last entry, which a
  // file may set to 2^28 for a pack of a few tokens.
  TORCH_CHECK_VALUE(!img_tokens || s.img_cu.back() == *img_tokens, "[mageflow] img_cu_seqlens must end at ",
                    img_tokens.value_or(0), " (image tokens), got ", s.img_cu.back());
  TORCH_CHECK_VALUE(!txt_tokens || s.txt_cu.back() == *txt_tokens, "[mageflow] txt_cu_seqlens must end at ",
                    txt_tokens.value_or(0), " (text tokens), got ", s.txt_cu.back());
  s.txt_sample = token_samples(s.txt_cu, device);
  s.img_sample = token_samples(s.img_cu, device);
  return s;
}

MageFlowTransformerBlockImpl::MageFlowTransformerBlockImpl(int64_t dim, int64_t heads) {
  img_mod_linear = Linear(dim, 6 * dim);
  txt_mod_linear = Linear(dim, 6 * dim);
  img_mod = register_module("img_mod", torch::nn::ModuleList(torch::nn::SiLU(), img_mod_linear));
  txt_mod = register_module("txt_mod", torch::nn::ModuleList(torch::nn::SiLU(), txt_mod_linear));
  attn = register_module("attn", Attention(dim, heads, /*context=*/true, /*output=*/true));
  img_mlp = register_module("img_mlp", FeedForward(dim));
  txt_mlp = register_module("txt_mlp", FeedForward(dim));
}

std::pair<at::Tensor, at::Tensor> MageFlowTransformerBlockImpl::forward(
    const at::Tensor& img_in, const at::Tensor& txt_in, const at::Tensor& temb,
    const RotaryTables& rope, const PackedSamples& samples, std::optional<Backend> checkpoint_ffn,
    const std::optional<SavedTensorOffload>& offload_attention) {
  // shift1, scale1, gate1, shift2, scale2, gate2, expanded per token: (1, tokens, D).
  Modulation m = img_mod_linear->forward(at::silu(temb)).chunk(6, -1);
  Modulation mt = txt_mod_linear->forward(at::silu(temb)).chunk(6, -1);
  for (auto& t : m) t = per_token(t, samples.img_sample);
  for (auto& t : mt) t = per_token(t, samples.txt_sample);

  at::Tensor img_mod_in = modulate(img_in, m[0], m[1]);
  at::Tensor txt_mod_in = modulate(txt_in, mt[0], mt[1]);
  // SimpleTuner's scope (MageFlow's block in simpletuner/helpers/models/mageflow/transformer.py):
  // the attention call, from the projections to the output projections.
  std::optional<OffloadSavedTensors> offload;
  offload.emplace(offload_attention);
  const QKV img = attn->project(img_mod_in);
  const QKV txt = attn->project_context(txt_mod_in);
  img_mod_in.reset();  // without autograd nothing else holds them
  txt_mod_in.reset();
  const at::Tensor qi = apply_rope(img.q, rope), ki = apply_rope(img.k, rope);  // text unrotated

  // Varlen attention: each sample attends over its own [text; image] tokens only.
  std::vector<at::Tensor> txt_parts, img_parts;
  for (int64_t b = 0; b < samples.num_samples(); ++b) {
    const int64_t t0 = samples.txt_cu[b], nt = samples.txt_cu[b + 1] - t0;
    const int64_t i0 = samples.img_cu[b], ni = samples.img_cu[b + 1] - i0;
    if (nt + ni == 0) continue;
    const at::Tensor q = at::cat({txt.q.narrow(1, t0, nt), qi.narrow(1, i0, ni)}, 1);
    const at::Tensor k = at::cat({txt.k.narrow(1, t0, nt), ki.narrow(1, i0, ni)}, 1);
    const at::Tensor v = at::cat({txt.v.narrow(1, t0, nt), img.v.narrow(1, i0, ni)}, 1);
    const at::Tensor o = attention(q, k, v);
    txt_parts.push_back(o.narrow(1, 0, nt));
    img_parts.push_back(o.narrow(1, nt, ni));
  }
  const at::Tensor img_attn = attn->to_out_0->forward(at::cat(img_parts, 1));
  const at::Tensor txt_attn = attn->to_add_out->forward(at::cat(txt_parts, 1));
  offload.reset();
  const at::Tensor img_res = img_in + m[2] * img_attn;
  const at::Tensor txt_res = txt_in + mt[2] * txt_attn;

  // SimpleTuner's MageFlow _ffn_forward, both streams.
  auto ffn = [this, m, mt](const Tensors& in) -> Tensors {
    at::Tensor x = in[0] + m[5] * img_mlp->forward(modulate(in[0], m[3], m[4]));
    at::Tensor c = in[1] + mt[5] * txt_mlp->forward(modulate(in[1], mt[3], mt[4]));
    return {clip_fp16(x), clip_fp16(c)};
  };
  const Tensors out = run_block_part(ffn, {img_res, txt_res}, checkpoint_ffn);
  return {out[1], out[0]};
}

MageFlowImpl::MageFlowImpl(MageFlowConfig config) : config_(std::move(config)) {
  config_.validate();
  const int64_t D = config_.hidden_size;
  img_in = register_module("img_in", Linear(config_.in_channels, D));
  txt_norm = register_module("txt_norm", RMSNorm(config_.context_in_dim));
  txt_in = register_module("txt_in", Linear(config_.context_in_dim, D));
  time_text_embed = register_module("time_text_embed", std::make_shared<torch::nn::Module>());
  timestep_embedder = time_text_embed->register_module("timestep_embedder", MlpEmbedder(kTimeChannels, D));
  auto blocks = register_module("transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.depth; ++i) {
    transformer_blocks.emplace_back(D, config_.num_heads);
    blocks->push_back(transformer_blocks.back());
  }
  norm_out = register_module("norm_out", AdaLayerNormContinuous(D));
  proj_out = register_module(
      "proj_out", Linear(D, config_.patch_size * config_.patch_size * config_.output_channels()));
}

void MageFlowImpl::set_checkpoint_plan(CheckpointPlan plan) {
  plan.validate();
  if (!plan.stack_layouts.empty()) {
    if (plan.stack_layouts.size() != 1) {
      throw_value_error("[mageflow] checkpoint plan needs 1 layout (one block stack), got " +
                        std::to_string(plan.stack_layouts.size()));
    }
    const Layout& layout = plan.stack_layouts[0];
    validate_layout(layout, layout.num_blocks());
    if (layout.num_blocks() > config_.depth) {
      throw_value_error("[mageflow] checkpoint layout must cover at most depth = " +
                        std::to_string(config_.depth) + " blocks, got " +
                        std::to_string(layout.num_blocks()));
    }
  }
  checkpointing_ = std::move(plan);
}

int64_t MageFlowImpl::set_block_swap(int64_t blocks_to_swap, std::optional<at::Device> device) {
  std::vector<std::shared_ptr<torch::nn::Module>> blocks;
  for (const auto& b : transformer_blocks) blocks.push_back(b.ptr());
  return replace_block_swap(*this, block_swap_, blocks, {config_.depth}, blocks_to_swap, device,
                            img_in->weight_device());
}

at::Tensor MageFlowImpl::forward(const at::Tensor& img, const at::Tensor& txt, const at::Tensor& timesteps,
                                 const std::vector<ImageShape>& img_shapes,
                                 const at::Tensor& img_cu_seqlens, const at::Tensor& txt_cu_seqlens,
                                 const std::vector<int64_t>& skip_layers) {
  TORCH_CHECK_VALUE(img.dim() == 3 && img.size(0) == 1 && img.size(2) == config_.in_channels,
                    "[mageflow] img must be (1, L, ", config_.in_channels, "), got shape ", img.sizes());
  TORCH_CHECK_VALUE(txt.dim() == 3 && txt.size(0) == 1 && txt.size(2) == config_.context_in_dim,
                    "[mageflow] txt must be (1, T, ", config_.context_in_dim, "), got shape ", txt.sizes());
  const PackedSamples samples =
      PackedSamples::from_cu_seqlens(txt_cu_seqlens, img_cu_seqlens, img.device(), txt.size(1), img.size(1));
  TORCH_CHECK_VALUE(timesteps.dim() == 1 && timesteps.size(0) == samples.num_samples(),
                    "[mageflow] timesteps must be (", samples.num_samples(), ") (one per sample), got shape ",
                    timesteps.sizes());
  int64_t shape_tokens = 0;
  for (size_t i = 0; i < img_shapes.size(); ++i) {
    TORCH_CHECK_VALUE(!__builtin_add_overflow(shape_tokens, image_tokens(img_shapes[i], i), &shape_tokens),
                      "[mageflow] img_shapes must cover ", img.size(1), " image tokens, got more than 2^63");
  }
  TORCH_CHECK_VALUE(shape_tokens == img.size(1), "[mageflow] img_shapes must cover ", img.size(1),
                    " image tokens, got ", shape_tokens);
  std::vector<bool> skipped(config_.depth, false);
  for (int64_t k : skip_layers) {
    TORCH_CHECK_VALUE(k >= 0 && k < config_.depth, "[mageflow] skip_layers entries must be in [0, ",
                      config_.depth, "), got ", k);
    skipped[k] = true;
  }
  std::vector<int64_t> active;
  for (int64_t k = 0; k < config_.depth; ++k) {
    if (!skipped[k]) active.push_back(k);
  }

  RotaryTables rope = mageflow_rope_tables(img_shapes, config_.axes_dim, kRopeTheta);
  rope.cos = rope.cos.to(img.device());
  rope.sin = rope.sin.to(img.device());
  at::Tensor x = img_in->forward(img);
  const auto dtype = x.scalar_type();
  at::Tensor c = txt_in->forward(txt_norm->forward(txt));
  // The reference casts the timesteps to the dtype of img_in's output before the sinusoid (as Flux
  // does): bfloat16 rounding in a bfloat16 model or under bfloat16 autocast, none in float32.
  const at::Tensor temb =
      timestep_embedder->forward(mageflow_timestep_projection(timesteps, kTimeChannels, dtype).to(dtype));

  const bool active_ckpt = checkpointing_.active(is_training());
  bool layer_scope = active_ckpt && !checkpointing_.ffn_scope();
  // MageFlow's ffn scope checkpoints the FFN of every block; the interval is ignored.
  const std::optional<Backend> ffn_backend =
      active_ckpt && checkpointing_.ffn_scope() ? std::optional<Backend>(checkpointing_.backend())
                                                : std::nullopt;
  const auto num_active = static_cast<int64_t>(active.size());
  std::vector<Layout> layouts;
  if (layer_scope) layouts = {checkpointing_.layout_for(0, num_active)};
  // Streamed blocks run as checkpoints while autograd records (remat/models/block_swap.h); their
  // FFN is then inside the block's checkpoint.
  const auto swap = block_swap_;
  const bool recording = torch::autograd::GradMode::is_enabled();
  const std::optional<SavedTensorOffload> offload_attention =
      is_training() && recording ? attention_offload_ : std::nullopt;
  if (swap) {
    TORCH_CHECK_VALUE(!recording || num_active == config_.depth,
                      "[mageflow] block swap with skip_layers needs no autograd recording (inference); ",
                      "skip_layers has ", config_.depth - num_active, " entries");
    if (recording && layouts.empty()) layouts = {layout_keep_all(num_active)};
    layouts = swap->prepare(std::move(layouts), recording);
    layer_scope = !layouts.empty();
  }
  const auto blocks = transformer_blocks;
  const RunBlock run_block = [blocks, active, temb, rope, samples, ffn_backend, swap, recording, offload_attention](
                                 int64_t p, const Tensors& state) -> Tensors {
    const int64_t k = active[p];
    if (swap) swap->use(k);
    const std::optional<Backend> ffn = swap && recording && swap->streamed(k) ? std::nullopt : ffn_backend;
    auto [c_out, x_out] = blocks[k].ptr()->forward(state[1], state[0], temb, rope, samples, ffn, offload_attention);
    return {c_out, x_out};
  };
  Tensors state{c, x};
  if (stage_observer_) stage_observer_("blocks_begin", state);
  if (layer_scope) {
    state = run_layout(layouts[0], state, run_block);
  } else {
    for (int64_t p = 0; p < num_active; ++p) state = run_block(p, state);
  }
  x = state[1];
  state.clear();  // the text stream is not needed past the last block
  if (stage_observer_) stage_observer_("blocks_end", {x});

  Modulation scale_shift = norm_out->forward(temb, dtype);  // scale first
  x = modulate(x, per_token(scale_shift[1], samples.img_sample), per_token(scale_shift[0], samples.img_sample));
  return proj_out->forward(x);
}

MageFlow make_quantized_mageflow(const MageFlowConfig& config, const BasePrecision& precision,
                                 const std::vector<io::SafetensorsFile>* files) {
  return make_quantized_model<MageFlow>(config, precision, files,
                                          [](MageFlowImpl& m, const std::vector<io::SafetensorsFile>& f) {
                                            load_state_dict_quantizing(m, f);
                                          });
}

}  // namespace remat::models
