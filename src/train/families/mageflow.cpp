// The MageFlow family (SimpleTuner's MageFlowTransformer2DModel): its descriptor and its adapter to
// remat::train::Transformer, which owns MageFlow's batch layout (packed variable-length samples).
#include <algorithm>

#include <torch/torch.h>

#include "remat/autocast.h"
#include "remat/default_dtype.h"
#include "remat/encoders/mageflow_demo_pipeline.h"
#include "remat/encoders/mageflow_encoders.h"
#include "remat/encoders/mageflow_text_encoder.h"
#include "remat/models/lora.h"
#include "remat/models/mageflow.h"
#include "remat/models/quantized_loading.h"
#include "remat/sample/mageflow_sampler.h"
#include "remat/train/family/family.h"
#include "remat/train/family/flow_matching.h"
#include "remat/train/family/transformer.h"
#include "remat/train/options/config.h"
#include "family/transformer_support.h"

namespace remat::train::families {
namespace {

using namespace support;

const char* const kMageFlowName = "mageflow";

// model_flavour values: SimpleTuner's names and hub ids (its mageflow/model.py HUGGINGFACE_PATHS, default
// base; its quickstart names microsoft/* repositories but its code loads natalie5/*, and remat follows
// the code), all the published architecture, then remat's small test configurations.
std::vector<FlavourSpec> mageflow_flavours() {
  // The edit flavours train text to image with the edit prompt template; a conditioning dataset is
  // refused with this reason.
  const std::string vision = "its reference pictures are read by Qwen3-VL's vision tower, which remat does not have";
  const auto edit = [&](const char* name, const char* summary, const char* hub_id) {
    FlavourSpec f{name, "mageflow-4b", summary, "", hub_id};
    f.pairs_unsupported = vision;
    return f;
  };
  return {
      {"base", "mageflow-4b", "Mage-Flow base, SimpleTuner's default (12 blocks, hidden size 3072)", "",
       "natalie5/Mage-Flow-Base"},
      {"default", "mageflow-4b", "Mage-Flow: the released model, same architecture as base", "",
       "natalie5/Mage-Flow"},
      {"turbo", "mageflow-4b", "Mage-Flow Turbo: the few-step model, same architecture as base", "",
       "natalie5/Mage-Flow-Turbo"},
      edit("edit-base", "Mage-Flow Edit base: trained on image edits (remat trains it text to image, edit template)",
           "natalie5/Mage-Flow-Edit-Base"),
      edit("edit", "Mage-Flow Edit: trained on image edits (remat trains it text to image, edit template)",
           "natalie5/Mage-Flow-Edit"),
      edit("edit-turbo", "Mage-Flow Edit Turbo: trained on image edits (remat trains it text to image, edit template)",
           "natalie5/Mage-Flow-Edit-Turbo"),
      {"mageflow-tiny", "mageflow-tiny", "remat's test configuration: 2 blocks, hidden size 64", ""},
      {"mageflow-small", "mageflow-small", "remat's small configuration: 6 blocks, hidden size 128", ""},
  };
}

models::MageFlowConfig mageflow_config_of(const TransformerSpec& spec) {
  return spec.config_json ? models::MageFlowConfig::from_json(*spec.config_json)
                          : models::MageFlowConfig::preset(model_family(kMageFlowName).preset_of(spec.flavour));
}

PlanProxy mageflow_plan_proxy(const TransformerSpec& spec) {
  const models::MageFlowConfig config = mageflow_config_of(spec);
  PlanProxy shape;
  shape.heads = config.num_heads;
  shape.head_dim = config.head_dim();
  shape.stack_sizes = {config.depth};
  shape.proxy = [config, spec](int64_t heads, int64_t blocks_per_stack) {
    models::MageFlowConfig narrow = config;
    narrow.num_heads = heads;
    narrow.hidden_size = heads * config.head_dim();
    narrow.depth = std::min(config.depth, blocks_per_stack);
    TransformerSpec out = spec;
    out.config_json = narrow.to_json();
    out.weights.reset();
    return out;
  };
  // A double-stream block like Flux's (models::linear_layers(MageFlowConfig)): per token each
  // stream multiplies by 12 D^2 weights (q, k, v, out and the 4x feed-forward); attention within
  // each sample's joint sequence, 2 T^2 D multiply-adds.
  const double d = static_cast<double>(config.hidden_size);
  shape.block_forward_flops = [d](size_t, int64_t image_tokens, int64_t text_tokens) {
    const double t = static_cast<double>(image_tokens + text_tokens);
    return 2.0 * (12.0 * d * d * t + 2.0 * t * t * d);
  };
  return shape;
}

// MageFlow trains on packed batches: the B samples of a batch are concatenated along the token
// axis (batch dimension 1), delimited by cu_seqlens; attention stays within each sample.
class MageFlowTransformer final : public Transformer {
 public:
  MageFlowTransformer(const TransformerSpec& spec, const at::Device& device) : model_(build(spec)) {
    model_->to(device);
  }

  static models::MageFlow build(const TransformerSpec& spec) {
    const models::MageFlowConfig config = mageflow_config_of(spec);
    // Built in its dtype: a bf16 model never has a float32 copy.
    DefaultDtypeGuard dtype(spec.dtype);
    if (spec.base_precision.mode == models::WeightQuantization::none) {
      models::MageFlow model(config);
      load_weights(*model, spec.weights, spec.variant);
      return model;
    }
    // Quantised as the weights stream by (remat/models/quantized_loading.h).
    if (!spec.weights) return models::make_quantized_mageflow(config, spec.base_precision);
    const auto files = support::open_weight_files(*spec.weights, spec.variant);
    return models::make_quantized_mageflow(config, spec.base_precision, &files);
  }

  std::string family() const override { return kMageFlowName; }
  torch::nn::Module& module() override { return *model_; }
  std::vector<int64_t> stack_sizes() const override { return {model_->config().depth}; }

  void set_checkpoint_plan(const CheckpointPlan& plan) override { model_->set_checkpoint_plan(plan); }
  int64_t set_block_swap(int64_t blocks_to_swap, const at::Device& device) override {
    return model_->set_block_swap(blocks_to_swap, device);
  }
  void set_attention_offload(const std::optional<SavedTensorOffload>& offload) override {
    model_->set_attention_offload(offload);
  }
  const models::BlockSwap* block_swap() const override { return model_->block_swap(); }
  models::BlockSwap* block_swap() override { return model_->block_swap(); }

  struct Packed {
    at::Tensor x0, txt, img_cu, txt_cu;  // x0 (1, B*H*W, C), txt (1, B*L, D)
    std::vector<models::ImageShape> shapes;
  };
  static Packed pack(const Batch& batch) {
    // Reference pictures of MageFlow's edit flavours need Qwen3-VL's vision tower (not built).
    TORCH_CHECK_VALUE(!batch.conditioning_latents.defined(),
                      "[mageflow] batches with reference pictures (conditioning_latents) are not supported: "
                      "remat trains MageFlow's edit flavours text-to-image only");
    const int64_t B = batch.latents.size(0), C = batch.latents.size(1);
    const int64_t h = batch.latents.size(2), w = batch.latents.size(3), L = batch.prompt_embeds.size(1);
    Packed p;
    // Per sample (C, h, w) -> (h*w, C), row-major tokens, samples back to back.
    p.x0 = batch.latents.permute({0, 2, 3, 1}).reshape({1, B * h * w, C});
    const auto int_options = at::TensorOptions().dtype(at::kInt);
    p.img_cu = at::arange(0, (B + 1) * h * w, h * w, int_options);
    if (batch.prompt_lengths.empty()) {
      p.txt = batch.prompt_embeds.reshape({1, B * L, batch.prompt_embeds.size(2)});
      p.txt_cu = at::arange(0, (B + 1) * L, L, int_options);
    } else {
      // Captions padded to the longest: each sample's own tokens, back to back (SimpleTuner's
      // _pack_text selects the masked tokens the same way).
      TORCH_CHECK_VALUE(static_cast<int64_t>(batch.prompt_lengths.size()) == B, "[mageflow] prompt_lengths has ",
                        batch.prompt_lengths.size(), " entries for ", B, " samples");
      std::vector<at::Tensor> parts;
      std::vector<int32_t> cu{0};
      for (int64_t i = 0; i < B; ++i) {
        const int64_t n = batch.prompt_lengths[static_cast<size_t>(i)];
        TORCH_CHECK_VALUE(n >= 1 && n <= L, "[mageflow] prompt_lengths[", i, "] must be in [1, ", L, "], got ", n);
        parts.push_back(batch.prompt_embeds[i].narrow(0, 0, n));
        cu.push_back(cu.back() + static_cast<int32_t>(n));
      }
      p.txt = at::cat(parts, 0).unsqueeze(0);
      p.txt_cu = torch::tensor(cu, int_options);
    }
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
    // mageflow/model.py _model_predict_single: timesteps (sigma x 1000) cast to the weight dtype,
    // then / 1000 there; SimpleTuner's weight dtype is the mixed-precision one (bf16) when it is on.
    const AutocastSnapshot autocast = AutocastSnapshot::capture();
    at::ScalarType t_dtype = model_->img_in->weight.scalar_type();
    if (device.is_cuda() ? autocast.cuda_enabled : autocast.cpu_enabled) {
      t_dtype = device.is_cuda() ? autocast.cuda_dtype : autocast.cpu_dtype;
    }
    const at::Tensor timesteps = (sigmas * 1000).to(t_dtype) / 1000;
    const at::Tensor prediction =
        model_->forward(x_t.unsqueeze(0), p.txt, timesteps, p.shapes, p.img_cu.to(device), p.txt_cu.to(device));
    return at::mse_loss(prediction.squeeze(0).to(at::kFloat), target.to(at::kFloat));
  }

  at::Tensor forward_named(const std::map<std::string, at::Tensor>& inputs) override {
    const auto get = check_named_inputs(
        inputs, {"img", "txt", "timesteps", "img_shapes", "img_cu_seqlens", "txt_cu_seqlens"},
        kMageFlowName, {"img_shapes", "img_cu_seqlens", "txt_cu_seqlens"});
    const at::Tensor shapes = get("img_shapes").to(at::kLong);
    TORCH_CHECK_VALUE(shapes.dim() == 2 && shapes.size(1) == 3,
                      "[mageflow] img_shapes must be (num_images, 3) of (frames, h, w), got shape ",
                      shapes.sizes());
    std::vector<models::ImageShape> img_shapes;
    for (int64_t i = 0; i < shapes.size(0); ++i) {
      img_shapes.push_back({shapes[i][0].item<int64_t>(), shapes[i][1].item<int64_t>(),
                            shapes[i][2].item<int64_t>()});
    }
    // Image and text states in the model's dtype (a bfloat16 model gets bfloat16 inputs, as the
    // reference's pipeline gives them); the timesteps stay float32, the model casts them.
    const auto dtype = model_->img_in->weight.scalar_type();
    return model_->forward(get("img").to(dtype), get("txt").to(dtype), get("timesteps"), img_shapes,
                           get("img_cu_seqlens"), get("txt_cu_seqlens"));
  }

  void set_stage_observer(StageObserver observer) override {
    model_->set_stage_observer(std::move(observer));
  }

  std::unique_ptr<sample::Denoiser> denoiser(const sample::FlowMatchSchedulerConfig& scheduler) override {
    return sample::mageflow_denoiser(*model_, scheduler);
  }

  Batch synthetic_batch(int64_t batch, int64_t image_tokens, int64_t text_tokens,
                        at::Generator& generator, const at::Device& device) override {
    check_synthetic_counts(kMageFlowName, batch, image_tokens, text_tokens);
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
    // The block runs as the model runs it in training, attention offload included.
    const std::optional<SavedTensorOffload> offload = model_->attention_offload();
    return {{"mageflow-block",
             [block, temb, rope, samples, ffn, offload](int64_t, const Tensors& s) -> Tensors {
               auto [txt, img] = block.ptr()->forward(s[1], s[0], temb, rope, samples, ffn, offload);
               return {txt, img};
             },
             state, trainable(*block)}};
  }

 private:
  models::MageFlow model_;
};

bool is_turbo(const std::string& flavour) { return flavour == "turbo" || flavour == "edit-turbo"; }

// check_user_config of SimpleTuner's mageflow/model.py: tokenizer_max_length defaults to 2048; turbo
// checkpoints are meant for few-step validation (SimpleTuner warns above 8 steps, remat when validation
// is on; remat also makes 4 steps without CFG the default when the config sets neither, as
// SimpleTuner's turbo examples do).
std::vector<std::string> apply_mageflow_flavour(TrainConfig& config, const std::vector<std::string>& given) {
  const auto set = [&](const char* key) { return std::find(given.begin(), given.end(), key) != given.end(); };
  std::vector<std::string> warnings;
  if (!set("tokenizer_max_length")) config.tokenizer_max_length = encoders::kMageFlowMaxSequenceLength;
  if (is_turbo(config.model_flavour)) {
    if (!set("validation_num_inference_steps")) config.validation_num_inference_steps = 4;
    if (!set("validation_guidance")) config.validation_guidance = 1.0;
    if (config.validation_num_inference_steps > 8 && !config.validation_disable) {
      warnings.push_back("[train] Mage-Flow Turbo checkpoints are intended for few-step validation; consider "
                         "validation_num_inference_steps 4 (got " +
                         std::to_string(config.validation_num_inference_steps) + ")");
    }
  }
  return warnings;
}

// The pipeline's scheduler config, else MageFlowPipeline's default (pipeline.py _load_scheduler).
sample::FlowMatchSchedulerConfig mageflow_scheduler(const encoders::PipelineFolder& folder, const std::string&) {
  if (folder.components.count("scheduler")) {
    return sample::FlowMatchSchedulerConfig::from_json_file(folder.directory("scheduler") + "/scheduler_config.json");
  }
  return sample::mageflow_default_scheduler();
}

// The text encoder, the VAE and the transformer must agree on the widths they exchange.
void check_mageflow_pipeline(const encoders::PipelineFolder& folder, const TransformerSpec& spec) {
  const auto config = mageflow_config_of(spec);
  if (folder.components.count("text_encoder")) {
    const auto text = encoders::mageflow_text_config_of(folder);
    if (text.hidden_size != config.context_in_dim) {
      throw_value_error("[sample] '" + folder.root + "': text_encoder/config.json has hidden_size " +
                        std::to_string(text.hidden_size) + " but the transformer takes context_in_dim " +
                        std::to_string(config.context_in_dim) + "; the components come from different models");
    }
  }
  if (folder.components.count("vae")) {
    const auto vae = encoders::mage_vae_config_of(folder);
    if (vae.latent_channels != config.in_channels || vae.latent_channels != config.output_channels()) {
      throw_value_error("[sample] '" + folder.root + "': the VAE has latent_channels " +
                        std::to_string(vae.latent_channels) + " but the transformer takes in_channels " +
                        std::to_string(config.in_channels) + " and makes out_channels " +
                        std::to_string(config.output_channels()) + "; the components come from different models");
    }
  }
}

}  // namespace

void register_family_mageflow() {
  ModelFamily f;
  f.name = kMageFlowName;
  f.display_name = "MageFlow";
  f.flavour_specs = mageflow_flavours();
  f.flavour_aliases = {{"mageflow-4b", "base"}};
  f.default_flavour = "base";
  f.small_flavour = "mageflow-tiny";
  f.latents = LatentLayout{kMageFlowName, /*channels=*/128, /*spatial_multiple=*/1, /*pooled=*/false,
                           /*variable_text_length=*/true};
  f.checkpointing = {/*interval=*/true, /*segment_stride=*/true, /*ffn_scope=*/true, {"blocks"},
                     /*block_swap=*/true, {"transformer_blocks"}, /*attention_offload=*/true};
  f.apply_flavour = apply_mageflow_flavour;
  // Qwen3-VL's language model and Mage-VAE (remat/encoders/mageflow_encoders.h).
  f.encoders = encoders::mageflow_family_encoders();
  f.pipeline_classes = {"MageFlowPipeline", "MageFlowEditPipeline"};
  f.guidance_is_cfg = true;  // MageFlowPipeline's guidance_scale weighs a negative prompt (CFG-Zero*)
  // MageFlowPipeline.__call__: 20 steps, guidance_scale 5.0; encode_prompt: max_sequence_length 2048.
  f.pipeline_defaults = {20, 5.0, encoders::kMageFlowMaxSequenceLength};
  f.max_sequence_length = 4096;  // tokenizer_max_length's bound; the pipeline itself has none
  f.scheduler = mageflow_scheduler;
  f.check_pipeline = check_mageflow_pipeline;
  f.write_demo_pipeline = encoders::write_mageflow_demo_pipeline;
  f.lora_target_presets = {"default"};
  f.lora_target_modules = models::mageflow_lora_target_modules;
  f.build = [](const TransformerSpec& spec, const c10::Device& device) -> std::unique_ptr<Transformer> {
    return std::make_unique<MageFlowTransformer>(spec, device);
  };
  f.conditioning = [](const TransformerSpec& spec) {
    const auto config = mageflow_config_of(spec);
    return ConditioningWidths{config.context_in_dim, 0, config.in_channels};
  };
  f.parameter_count = [](const TransformerSpec& spec) { return models::parameter_count(mageflow_config_of(spec)); };
  f.linear_layers = [](const TransformerSpec& spec) { return models::linear_layers(mageflow_config_of(spec)); };
  f.attention_layers = [](const TransformerSpec& spec) {
    // Each block attends over a sample's text and image tokens joined (within the sample only).
    const auto config = mageflow_config_of(spec);
    return AttentionLayers{config.depth, config.num_heads};
  };
  f.plan_proxy = mageflow_plan_proxy;
  register_family(std::move(f));
}

}  // namespace remat::train::families
