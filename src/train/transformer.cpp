// Model families behind remat::train::Transformer. Each adapter owns the family's batch layout
// (Flux: 2x2-packed latents with position ids; MageFlow: packed variable-length samples).
#include "remat/train/transformer.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "remat/io/safetensors.h"
#include "remat/models/blocks.h"
#include "remat/models/flux.h"
#include "remat/models/lora.h"
#include "remat/models/mageflow.h"
#include "remat/train/schedule.h"

namespace remat::train {
namespace {

SigmaSampling sampling_of(const FlowMatchingOptions& options) {
  return options.uniform ? SigmaSampling::Uniform : SigmaSampling::LogitNormal;
}

bool any_requires_grad(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) return true;
  }
  return false;
}

std::vector<at::Tensor> trainable(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

void load_weights(torch::nn::Module& module, const std::optional<std::string>& weights) {
  if (!weights) return;
  io::load_state_dict_into(module, *weights);  // strict: names every missing/unexpected key
}

// Shared by the families' synthetic_batch: counts must be >= 1.
void check_synthetic_counts(const std::string& family, int64_t batch, int64_t image_tokens,
                            int64_t text_tokens) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"batch", batch},
                                    {"image_tokens", image_tokens},
                                    {"text_tokens", text_tokens}}) {
    if (value < 1) {
      throw std::invalid_argument("[" + family + "] " + name + " must be >= 1, got " +
                                  std::to_string(value));
    }
  }
}

// Rows of the most square rows x cols grid with rows * cols = tokens (rows <= cols).
int64_t squarest_rows(int64_t tokens) {
  int64_t rows = static_cast<int64_t>(std::sqrt(static_cast<double>(tokens)));
  while (rows > 1 && tokens % rows != 0) --rows;
  return rows;
}

// Both models expose SimpleTuner's checkpointing controls under the same names; only the number
// of block stacks (explicit layouts) differs.
template <typename Model, typename SetLayouts>
void apply_checkpointing(Model& model, const CheckpointingSpec& spec, size_t num_stacks,
                         SetLayouts set_layouts) {
  if (!spec.enabled) {
    model.disable_gradient_checkpointing();
    return;
  }
  model.enable_gradient_checkpointing();
  model.set_gradient_checkpointing_backend(spec.backend);
  model.set_gradient_checkpointing_interval(spec.interval);
  model.set_gradient_checkpointing_segment_stride(spec.segment_stride);
  if (spec.layouts.empty()) {
    model.clear_gradient_checkpointing_layout();
    return;
  }
  TORCH_CHECK_VALUE(spec.layouts.size() == num_stacks, "[checkpointing] this model needs ",
                    num_stacks, " layouts (one per block stack), got ", spec.layouts.size());
  set_layouts(spec.layouts);
}

// Checks that `inputs` holds exactly `expected` (every name missing or unexpected is listed) with
// floating dtypes; returns an accessor giving each as float32.
std::function<at::Tensor(const std::string&)> check_named_inputs(
    const std::map<std::string, at::Tensor>& inputs, const std::vector<std::string>& expected,
    const std::string& family, const std::vector<std::string>& integer_inputs = {}) {
  std::vector<std::string> missing, unexpected;
  for (const auto& name : expected) {
    if (inputs.count(name) == 0) missing.push_back(name);
  }
  for (const auto& [name, tensor] : inputs) {
    if (std::find(expected.begin(), expected.end(), name) == expected.end()) unexpected.push_back(name);
  }
  const auto join = [](const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
    return out;
  };
  TORCH_CHECK_VALUE(missing.empty() && unexpected.empty(), "[", family, "] inputs must be exactly {",
                    join(expected), "}", missing.empty() ? "" : "; missing: " + join(missing),
                    unexpected.empty() ? "" : "; unexpected: " + join(unexpected));
  for (const auto& [name, tensor] : inputs) {
    const bool integer = std::find(integer_inputs.begin(), integer_inputs.end(), name) != integer_inputs.end();
    if (integer) {
      TORCH_CHECK_VALUE(at::isIntegralType(tensor.scalar_type(), /*includeBool=*/false), "[", family,
                        "] input ", name, " must be an integer tensor (I32, I64), got ",
                        tensor.scalar_type());
    } else {
      TORCH_CHECK_VALUE(at::isFloatingType(tensor.scalar_type()), "[", family, "] input ", name,
                        " must be a floating tensor (F32, F16, BF16, F64), got ", tensor.scalar_type());
    }
  }
  return [&inputs, integer_inputs](const std::string& name) {
    const bool integer = std::find(integer_inputs.begin(), integer_inputs.end(), name) != integer_inputs.end();
    return integer ? inputs.at(name) : inputs.at(name).to(at::kFloat);
  };
}

class FluxTransformer final : public Transformer {
 public:
  FluxTransformer(const TransformerSpec& spec, const at::Device& device)
      : model_(spec.config_json ? models::FluxConfig::from_json(*spec.config_json)
                                : models::FluxConfig::preset(spec.preset)) {
    load_weights(*model_, spec.weights);
    model_->to(device);
  }

  std::string family() const override { return "flux"; }
  torch::nn::Module& module() override { return *model_; }
  std::vector<int64_t> stack_sizes() const override {
    return {model_->config().num_layers, model_->config().num_single_layers};
  }

  void configure_checkpointing(const CheckpointingSpec& spec) override {
    apply_checkpointing(*model_, spec, 2, [this](const std::vector<Layout>& layouts) {
      model_->set_gradient_checkpointing_layout(layouts[0], layouts[1]);
    });
  }

  std::vector<std::string> apply_lora(const std::string& target_preset, int64_t rank,
                                      double alpha) override {
    return models::apply_lora(*model_, models::lora_target_preset("flux", target_preset), rank, alpha);
  }

  // Model inputs of a batch: x0 packed (B, N_i, 4C), ids, and the text conditioning.
  struct Inputs {
    at::Tensor x0, prompt_embeds, pooled, img_ids, txt_ids;
  };
  Inputs inputs_of(const Batch& batch) const {
    TORCH_CHECK_VALUE(batch.pooled_prompt_embeds.defined(),
                      "[flux] batches need pooled_prompt_embeds (a Flux latent cache)");
    const int64_t h = batch.latents.size(2), w = batch.latents.size(3);
    const auto device = batch.latents.device();
    return {models::flux_pack_latents(batch.latents), batch.prompt_embeds, batch.pooled_prompt_embeds,
            models::flux_image_ids(h / 2, w / 2).to(device),
            models::flux_text_ids(batch.prompt_embeds.size(1)).to(device)};
  }

  at::Tensor flow_matching_loss(const Batch& batch, const FlowMatchingOptions& options,
                                at::Generator& generator) override {
    const Inputs in = inputs_of(batch);
    const int64_t B = in.x0.size(0);
    // Noise and sigmas come from the trainer's CPU generator (reproducible on any device).
    const at::Tensor noise =
        at::randn(in.x0.sizes(), generator, at::TensorOptions().dtype(at::kFloat)).to(in.x0.device());
    const at::Tensor sigmas = sample_sigmas(B, sampling_of(options), options.sigmoid_scale,
                                            options.shift, generator)
                                  .to(in.x0.device());
    const auto [x_t, target] = flow_matching_pair(in.x0, noise, sigmas);
    std::optional<at::Tensor> guidance;
    if (model_->config().guidance_embeds) {
      guidance = at::full({B}, options.guidance_value, sigmas.options());
    }
    const at::Tensor prediction =
        model_->forward(x_t, in.prompt_embeds, in.pooled, sigmas, in.img_ids, in.txt_ids, guidance);
    return at::mse_loss(prediction.to(at::kFloat), target.to(at::kFloat));
  }

  at::Tensor forward_named(const std::map<std::string, at::Tensor>& inputs) override {
    const bool guided = model_->config().guidance_embeds;
    std::vector<std::string> expected{"hidden_states", "encoder_hidden_states", "pooled_projections",
                                      "timestep", "img_ids", "txt_ids"};
    if (guided) expected.push_back("guidance");
    const auto get = check_named_inputs(inputs, expected, "flux");
    return model_->forward(get("hidden_states"), get("encoder_hidden_states"),
                           get("pooled_projections"), get("timestep"), get("img_ids"),
                           get("txt_ids"), guided ? std::optional<at::Tensor>(get("guidance")) : std::nullopt);
  }

  Batch synthetic_batch(int64_t batch, int64_t image_tokens, int64_t text_tokens,
                        at::Generator& generator, const at::Device& device) override {
    check_synthetic_counts("flux", batch, image_tokens, text_tokens);
    const auto& config = model_->config();
    const int64_t rows = squarest_rows(image_tokens), cols = image_tokens / rows;
    TORCH_CHECK_VALUE(config.in_channels % 4 == 0, "[flux] in_channels must be a multiple of 4 "
                      "(2x2-packed latents), got ", config.in_channels);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    Batch out;
    out.latents = at::randn({batch, config.in_channels / 4, 2 * rows, 2 * cols}, generator, f32).to(device);
    out.prompt_embeds = at::randn({batch, text_tokens, config.joint_attention_dim}, generator, f32).to(device);
    out.pooled_prompt_embeds = at::randn({batch, config.pooled_projection_dim}, generator, f32).to(device);
    for (int64_t i = 0; i < batch; ++i) out.indices.push_back(i);
    return out;
  }

  void set_stage_observer(StageObserver observer) override {
    model_->set_stage_observer(std::move(observer));
  }

  std::vector<BlockProbe> block_probes(const Batch& batch, std::optional<Backend> ffn) override {
    const Inputs in = inputs_of(batch);
    const auto& config = model_->config();
    const int64_t B = in.x0.size(0), n_img = in.x0.size(1), n_txt = in.prompt_embeds.size(1);
    const auto options = in.x0.options().dtype(model_->x_embedder->weight.scalar_type());
    const auto state = [&](int64_t n) {
      return torch::randn({B, n, config.hidden_size()}, options).requires_grad_(true);
    };
    at::Tensor temb = torch::randn({B, config.hidden_size()}, options);
    if (model_->time_text_embed && any_requires_grad(*model_->time_text_embed)) temb.requires_grad_(true);
    const models::RotaryTables rope = models::flux_rope_tables(
        at::cat({in.txt_ids, in.img_ids}, 0), config.axes_dims_rope);
    std::vector<BlockProbe> probes;
    if (config.num_layers > 0) {
      auto block = model_->transformer_blocks.front();
      probes.push_back({"flux-double",
                        [block, temb, rope, ffn](int64_t, const Tensors& s) -> Tensors {
                          auto [c, x] = block.ptr()->forward(s[0], s[1], temb, rope, ffn);
                          return {x, c};
                        },
                        {state(n_img), state(n_txt)},
                        trainable(*block)});
    }
    if (config.num_single_layers > 0) {
      auto block = model_->single_transformer_blocks.front();
      probes.push_back({"flux-single",
                        [block, temb, rope, ffn](int64_t, const Tensors& s) -> Tensors {
                          return {block.ptr()->forward(s[0], temb, rope, ffn)};
                        },
                        {state(n_txt + n_img)},
                        trainable(*block)});
    }
    return probes;
  }

 private:
  models::Flux model_;
};


// MageFlow trains on packed batches: the B samples of a batch are concatenated along the token
// axis (batch dimension 1), delimited by cu_seqlens; attention stays within each sample.
class MageFlowTransformer final : public Transformer {
 public:
  MageFlowTransformer(const TransformerSpec& spec, const at::Device& device)
      : model_(spec.config_json ? models::MageFlowConfig::from_json(*spec.config_json)
                                : models::MageFlowConfig::preset(spec.preset)) {
    load_weights(*model_, spec.weights);
    model_->to(device);
  }

  std::string family() const override { return "mageflow"; }
  torch::nn::Module& module() override { return *model_; }
  std::vector<int64_t> stack_sizes() const override { return {model_->config().depth}; }

  void configure_checkpointing(const CheckpointingSpec& spec) override {
    apply_checkpointing(*model_, spec, 1, [this](const std::vector<Layout>& layouts) {
      model_->set_gradient_checkpointing_layout(layouts[0]);
    });
  }

  std::vector<std::string> apply_lora(const std::string& target_preset, int64_t rank,
                                      double alpha) override {
    return models::apply_lora(*model_, models::lora_target_preset("mageflow", target_preset), rank, alpha);
  }

  struct Packed {
    at::Tensor x0, txt, img_cu, txt_cu;  // x0 (1, B*H*W, C), txt (1, B*L, D)
    std::vector<models::ImageShape> shapes;
  };
  static Packed pack(const Batch& batch) {
    const int64_t B = batch.latents.size(0), C = batch.latents.size(1);
    const int64_t h = batch.latents.size(2), w = batch.latents.size(3), L = batch.prompt_embeds.size(1);
    Packed p;
    // Per sample (C, h, w) -> (h*w, C), row-major tokens, samples back to back.
    p.x0 = batch.latents.permute({0, 2, 3, 1}).reshape({1, B * h * w, C});
    p.txt = batch.prompt_embeds.reshape({1, B * L, batch.prompt_embeds.size(2)});
    const auto int_options = at::TensorOptions().dtype(at::kInt);
    p.img_cu = at::arange(0, (B + 1) * h * w, h * w, int_options);
    p.txt_cu = at::arange(0, (B + 1) * L, L, int_options);
    p.shapes.assign(static_cast<size_t>(B), models::ImageShape{1, h, w});
    return p;
  }

  at::Tensor flow_matching_loss(const Batch& batch, const FlowMatchingOptions& options,
                                at::Generator& generator) override {
    const Packed p = pack(batch);
    const int64_t B = batch.latents.size(0), per_sample = p.x0.size(1) / B;
    const auto device = p.x0.device();
    const at::Tensor noise =
        at::randn(p.x0.sizes(), generator, at::TensorOptions().dtype(at::kFloat)).to(device);
    const at::Tensor sigmas = sample_sigmas(B, sampling_of(options), options.sigmoid_scale,
                                            options.shift, generator)
                                  .to(device);
    // Per-token sigma: each sample's tokens share its sigma.
    const at::Tensor token_sigmas = sigmas.repeat_interleave(per_sample);
    const auto [x_t, target] = flow_matching_pair(p.x0.squeeze(0), noise.squeeze(0), token_sigmas);
    const at::Tensor prediction =
        model_->forward(x_t.unsqueeze(0), p.txt, sigmas, p.shapes, p.img_cu.to(device), p.txt_cu.to(device));
    return at::mse_loss(prediction.squeeze(0).to(at::kFloat), target.to(at::kFloat));
  }

  at::Tensor forward_named(const std::map<std::string, at::Tensor>& inputs) override {
    const auto get = check_named_inputs(
        inputs, {"img", "txt", "timesteps", "img_shapes", "img_cu_seqlens", "txt_cu_seqlens"},
        "mageflow", {"img_shapes", "img_cu_seqlens", "txt_cu_seqlens"});
    const at::Tensor shapes = get("img_shapes").to(at::kLong);
    TORCH_CHECK_VALUE(shapes.dim() == 2 && shapes.size(1) == 3,
                      "[mageflow] img_shapes must be (num_images, 3) of (frames, h, w), got shape ",
                      shapes.sizes());
    std::vector<models::ImageShape> img_shapes;
    for (int64_t i = 0; i < shapes.size(0); ++i) {
      img_shapes.push_back({shapes[i][0].item<int64_t>(), shapes[i][1].item<int64_t>(),
                            shapes[i][2].item<int64_t>()});
    }
    return model_->forward(get("img"), get("txt"), get("timesteps"), img_shapes,
                           get("img_cu_seqlens"), get("txt_cu_seqlens"));
  }

  void set_stage_observer(StageObserver observer) override {
    model_->set_stage_observer(std::move(observer));
  }

  Batch synthetic_batch(int64_t batch, int64_t image_tokens, int64_t text_tokens,
                        at::Generator& generator, const at::Device& device) override {
    check_synthetic_counts("mageflow", batch, image_tokens, text_tokens);
    const auto& config = model_->config();
    const int64_t rows = squarest_rows(image_tokens);  // one latent pixel is one token
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    Batch out;
    out.latents = at::randn({batch, config.in_channels, rows, image_tokens / rows}, generator, f32).to(device);
    out.prompt_embeds = at::randn({batch, text_tokens, config.context_in_dim}, generator, f32).to(device);
    for (int64_t i = 0; i < batch; ++i) out.indices.push_back(i);
    return out;
  }

  std::vector<BlockProbe> block_probes(const Batch& batch, std::optional<Backend> ffn) override {
    const auto& config = model_->config();
    if (config.depth == 0) return {};
    const Packed p = pack(batch);
    const auto device = p.x0.device();
    const auto options = p.x0.options().dtype(model_->img_in->weight.scalar_type());
    const int64_t B = batch.latents.size(0);
    at::Tensor temb = torch::randn({B, config.hidden_size}, options);
    if (model_->time_text_embed && any_requires_grad(*model_->time_text_embed)) temb.requires_grad_(true);
    models::RotaryTables rope = models::mageflow_rope_tables(p.shapes, config.axes_dim);
    rope = {rope.cos.to(device), rope.sin.to(device)};
    const models::PackedSamples samples =
        models::PackedSamples::from_cu_seqlens(p.txt_cu, p.img_cu, device);
    auto block = model_->transformer_blocks.front();
    Tensors state{torch::randn({1, p.txt.size(1), config.hidden_size}, options).requires_grad_(true),
                  torch::randn({1, p.x0.size(1), config.hidden_size}, options).requires_grad_(true)};
    return {{"mageflow-block",
             [block, temb, rope, samples, ffn](int64_t, const Tensors& s) -> Tensors {
               auto [txt, img] = block.ptr()->forward(s[1], s[0], temb, rope, samples, ffn);
               return {txt, img};
             },
             state, trainable(*block)}};
  }

 private:
  models::MageFlow model_;
};

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> Transformer::trainable_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module().named_parameters()) {
    if (item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  }
  return out;
}

std::unique_ptr<Transformer> make_transformer(const TransformerSpec& spec, const at::Device& device) {
  if (spec.family == "flux") return std::make_unique<FluxTransformer>(spec, device);
  if (spec.family == "mageflow") return std::make_unique<MageFlowTransformer>(spec, device);
  throw std::invalid_argument("[train] model_family must be one of flux, mageflow, got '" +
                              spec.family + "'");
}

Batch batch_to(const Batch& batch, const at::Device& device) {
  Batch out = batch;
  const auto move = [&](const at::Tensor& t) {
    return t.defined() ? t.to(device, at::kFloat) : t;
  };
  out.latents = move(batch.latents);
  out.prompt_embeds = move(batch.prompt_embeds);
  out.pooled_prompt_embeds = move(batch.pooled_prompt_embeds);
  return out;
}

std::pair<at::Tensor, at::Tensor> flow_matching_pair(const at::Tensor& x0, const at::Tensor& noise,
                                                     const at::Tensor& sigmas) {
  TORCH_CHECK_VALUE(sigmas.dim() == 1 && sigmas.size(0) == x0.size(0),
                    "[flow matching] sigmas must be (B) with B = ", x0.size(0), ", got shape ",
                    sigmas.sizes());
  std::vector<int64_t> shape(x0.dim(), 1);
  shape[0] = x0.size(0);
  const at::Tensor s = sigmas.view(shape).to(x0.scalar_type());
  return {(1 - s) * x0 + s * noise, noise - x0};
}

}  // namespace remat::train
