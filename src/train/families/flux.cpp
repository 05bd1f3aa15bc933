// The Flux.1 family (diffusers FluxTransformer2DModel): its descriptor, its options and its
// adapter to remat::train::Transformer, which owns Flux's batch layout (2x2-packed latents with
// position ids, T5 states and CLIP's pooled embedding, a guidance input for the
// guidance-distilled models).
#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "remat/default_dtype.h"
#include "remat/encoders/autoencoder_kl_config.h"
#include "remat/encoders/clip_text_model.h"
#include "remat/encoders/demo_pipeline.h"
#include "remat/encoders/flux_encoders.h"
#include "remat/models/flux_transformer_weights.h"
#include "remat/encoders/t5_config.h"
#include "remat/util/error.h"
#include "remat/io/safetensors.h"
#include "remat/models/flux.h"
#include "remat/models/flux_weight_formats.h"
#include "remat/models/lora.h"
#include "remat/models/quantized_loading.h"
#include "remat/sample/flux_sampler.h"
#include "remat/train/family/family.h"
#include "remat/train/family/flow_matching.h"
#include "remat/train/family/transformer.h"
#include "options/option_builder.h"
#include "family/transformer_support.h"

namespace remat::train::families {
namespace {

using namespace support;

const char* const kFluxName = "flux";

// model_flavour values: SimpleTuner's names and hub ids (its flux/model.py HUGGINGFACE_PATHS, default krea)
// on remat's presets, then remat's small test configurations.
std::vector<FlavourSpec> flux_flavours() {
  return {
      {"krea", "flux-dev", "FLUX.1 Krea [dev], SimpleTuner's default: the dev architecture (guidance embedder, "
                           "19 double + 38 single blocks)", "",
       "black-forest-labs/flux.1-krea-dev"},
      {"dev", "flux-dev", "FLUX.1 [dev]: guidance-distilled, trained with flux_guidance_value as its guidance "
                          "input", "",
       "black-forest-labs/flux.1-dev"},
      {"schnell", "flux-schnell", "FLUX.1 [schnell]: no guidance embedder (SimpleTuner also adds its schnell "
                                  "assistant LoRA and needs flux_fast_schedule; remat does neither)", "",
       "black-forest-labs/flux.1-schnell"},
      {"kontext", "flux-dev", "FLUX.1 Kontext [dev]: the dev architecture trained on picture edits; trains on "
                              "pairs (each image dataset's conditioning_data names its reference pictures)", "",
       "black-forest-labs/flux.1-kontext-dev", /*trains_on_pairs=*/true},
      {"fluxbooru", "flux-dev", "FluxBooru v0.3: the dev architecture with a fixed guidance input of 3.5 "
                                "(flux_guidance_value is set to 3.5, as SimpleTuner does)", "",
       "terminusresearch/fluxbooru-v0.3"},
      {"libreflux", "flux-schnell", "LibreFlux: a de-distilled schnell (no guidance embedder) that needs "
                                    "attention masking",
       "attention masking of padded text tokens (flux_attention_masked_training)",
       "jimmycarter/LibreFlux-SimpleTuner"},
      {"flux-tiny", "flux-tiny", "remat's test configuration: 2 + 2 blocks, hidden size 64", ""},
      {"flux-small", "flux-small", "remat's small configuration for demos and benchmarks: 4 + 8 blocks, "
                                   "hidden size 128", ""},
  };
}

models::FluxConfig flux_config_of(const TransformerSpec& spec) {
  if (spec.config_json) return models::FluxConfig::from_json(*spec.config_json);
  // A single Black Forest Labs file carries no config.json: its shapes define the model.
  if (spec.weights && models::is_bfl_flux_file(*spec.weights)) {
    return models::flux_config_from_bfl(io::SafetensorsFile::open(*spec.weights));
  }
  return models::FluxConfig::preset(model_family(kFluxName).preset_of(spec.flavour));
}

// A FluxConfig as the diffusers config.json keys FluxConfig::from_json_string reads.
std::string flux_config_json(const models::FluxConfig& c) {
  std::string axes;
  for (size_t i = 0; i < c.axes_dims_rope.size(); ++i) axes += (i ? ", " : "") + std::to_string(c.axes_dims_rope[i]);
  return "{\"patch_size\": " + std::to_string(c.patch_size) + ", \"in_channels\": " + std::to_string(c.in_channels) +
         ", \"out_channels\": " + (c.out_channels ? std::to_string(*c.out_channels) : std::string("null")) +
         ", \"num_layers\": " + std::to_string(c.num_layers) +
         ", \"num_single_layers\": " + std::to_string(c.num_single_layers) +
         ", \"attention_head_dim\": " + std::to_string(c.attention_head_dim) +
         ", \"num_attention_heads\": " + std::to_string(c.num_attention_heads) +
         ", \"joint_attention_dim\": " + std::to_string(c.joint_attention_dim) +
         ", \"pooled_projection_dim\": " + std::to_string(c.pooled_projection_dim) +
         ", \"guidance_embeds\": " + (c.guidance_embeds ? "true" : "false") + ", \"axes_dims_rope\": [" + axes + "]}";
}

PlanProxy flux_plan_proxy(const TransformerSpec& spec) {
  const models::FluxConfig config = flux_config_of(spec);
  PlanProxy shape;
  shape.heads = config.num_attention_heads;
  shape.head_dim = config.attention_head_dim;
  shape.stack_sizes = {config.num_layers, config.num_single_layers};
  shape.proxy = [config, spec](int64_t heads, int64_t blocks_per_stack) {
    models::FluxConfig narrow = config;
    narrow.num_attention_heads = heads;
    narrow.num_layers = std::min(config.num_layers, blocks_per_stack);
    narrow.num_single_layers = std::min(config.num_single_layers, blocks_per_stack);
    TransformerSpec out = spec;
    out.config_json = flux_config_json(narrow);
    out.weights.reset();
    return out;
  };
  // Per token, a double block's image and text streams each multiply by 12 D^2 weights (q, k, v
  // and out: 4 D^2; the feed-forward D x 4D and 4D x D: 8 D^2); a single block its q, k, v
  // (3 D^2), proj_mlp (4 D^2) and proj_out (5 D x D) over every token. Attention over the
  // joint sequence of T tokens: Q K^T and P V, 2 T^2 D multiply-adds. The modulation Linears
  // run once per sample: left out.
  const double d = static_cast<double>(config.hidden_size());
  shape.block_forward_flops = [d](size_t, int64_t image_tokens, int64_t text_tokens) {
    const double t = static_cast<double>(image_tokens + text_tokens);
    return 2.0 * (12.0 * d * d * t + 2.0 * t * t * d);
  };
  return shape;
}

// SimpleTuner's per-flavour settings (flux/model.py check_user_config).
std::vector<std::string> apply_flux_flavour(TrainConfig& config, const std::vector<std::string>&) {
  std::vector<std::string> warnings;
  if (config.model_flavour == "fluxbooru" && config.flux_guidance_value != 3.5) {
    warnings.push_back("[train] model_flavour fluxbooru trains with flux_guidance_value 3.5 (as SimpleTuner "
                       "does); replacing " + render_float(config.flux_guidance_value));
    config.flux_guidance_value = 3.5;
  }
  if (config.model_flavour == "schnell") {
    warnings.push_back("[train] model_flavour schnell: SimpleTuner would also train on top of its schnell "
                       "assistant LoRA and require flux_fast_schedule; remat trains the plain schnell "
                       "transformer with the usual timestep sampling");
  }
  return warnings;
}

class FluxTransformer final : public Transformer {
 public:
  FluxTransformer(const TransformerSpec& spec, const at::Device& device) : model_(build(spec)) {
    model_->to(device);
  }

  static models::Flux build(const TransformerSpec& spec) {
    const models::FluxConfig config = flux_config_of(spec);
    // Built in its dtype: a bf16 model never has a float32 copy.
    DefaultDtypeGuard dtype(spec.dtype);
    if (spec.base_precision.mode == models::WeightQuantization::none) {
      models::Flux model(config);
      // Either layout (diffusers or BFL), a file or a component folder.
      if (spec.weights) models::load_flux_transformer_weights(*model, *spec.weights, spec.variant);
      return model;
    }
    // Quantised without ever holding the float32 model: each base Linear's weight is quantised
    // as it streams from the file (or as it is initialised), one at a time.
    if (!spec.weights) return models::make_quantized_flux(config, spec.base_precision);
    const auto files = support::open_weight_files(*spec.weights, spec.variant);
    return models::make_quantized_flux(config, spec.base_precision, &files);
  }

  std::string family() const override { return kFluxName; }
  torch::nn::Module& module() override { return *model_; }
  std::vector<int64_t> stack_sizes() const override {
    return {model_->config().num_layers, model_->config().num_single_layers};
  }

  void set_checkpoint_plan(const CheckpointPlan& plan) override { model_->set_checkpoint_plan(plan); }
  int64_t set_block_swap(int64_t blocks_to_swap, const at::Device& device) override {
    return model_->set_block_swap(blocks_to_swap, device);
  }
  void set_attention_offload(const std::optional<SavedTensorOffload>& offload) override {
    model_->set_attention_offload(offload);
  }
  const models::BlockSwap* block_swap() const override { return model_->block_swap(); }
  models::BlockSwap* block_swap() override { return model_->block_swap(); }

  std::unique_ptr<sample::Denoiser> denoiser(const sample::FlowMatchSchedulerConfig& scheduler) override {
    return sample::flux_denoiser(*model_, scheduler);
  }

  // Model inputs of a batch: x0 packed (B, N_i, 4C), ids, and the text conditioning; for Kontext
  // also the reference's packed clean latents (B, N_r, 4C), whose ids follow the image's in img_ids.
  struct Inputs {
    at::Tensor x0, prompt_embeds, pooled, img_ids, txt_ids;
    at::Tensor reference;
  };
  Inputs inputs_of(const Batch& batch) const {
    TORCH_CHECK_VALUE(batch.pooled_prompt_embeds.defined(),
                      "[flux] batches need pooled_prompt_embeds (a Flux latent cache)");
    const int64_t h = batch.latents.size(2), w = batch.latents.size(3);
    const auto device = batch.latents.device();
    Inputs in{models::flux_pack_latents(batch.latents), batch.prompt_embeds, batch.pooled_prompt_embeds,
              models::flux_image_ids(h / 2, w / 2).to(device),
              models::flux_text_ids(batch.prompt_embeds.size(1)).to(device), at::Tensor()};
    if (const at::Tensor& c = batch.conditioning_latents; c.defined()) {
      // SimpleTuner's prepare_batch_conditions -> build_kontext_inputs (flux/__init__.py) for one
      // reference: packed like the latents, ids (1, r, c).
      TORCH_CHECK_VALUE(c.dim() == 4 && c.size(0) == batch.latents.size(0) && c.size(1) == batch.latents.size(1) &&
                            c.size(2) % 2 == 0 && c.size(3) % 2 == 0,
                        "[flux] conditioning_latents must be (B, C, Hc, Wc) = (", batch.latents.size(0), ", ",
                        batch.latents.size(1), ", even, even), got ", c.sizes());
      in.reference = models::flux_pack_latents(c);
      in.img_ids = at::cat({in.img_ids, models::flux_reference_ids(c.size(2) / 2, c.size(3) / 2).to(device)}, 0);
    }
    return in;
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
    // Kontext (SimpleTuner's FluxModel._model_predict_single): the reference tokens follow the
    // noisy ones, clean, and their predictions are dropped before the loss. Every token gets the
    // sample's timestep, as FluxKontextPipeline samples and as SimpleTuner trained before its
    // tokenwise timesteps (it now gives the reference tokens timestep 0).
    const int64_t n_target = x_t.size(1);
    const at::Tensor tokens = in.reference.defined() ? at::cat({x_t, in.reference.to(x_t.scalar_type())}, 1) : x_t;
    at::Tensor prediction =
        model_->forward(tokens, in.prompt_embeds, in.pooled, sigmas, in.img_ids, in.txt_ids, guidance);
    if (in.reference.defined()) prediction = prediction.narrow(1, 0, n_target);
    return at::mse_loss(prediction.to(at::kFloat), target.to(at::kFloat));
  }

  at::Tensor forward_named(const std::map<std::string, at::Tensor>& inputs) override {
    const bool guided = model_->config().guidance_embeds;
    std::vector<std::string> expected{"hidden_states", "encoder_hidden_states", "pooled_projections",
                                      "timestep", "img_ids", "txt_ids"};
    if (guided) expected.push_back("guidance");
    const auto get = check_named_inputs(inputs, expected, kFluxName);
    return model_->forward(get("hidden_states"), get("encoder_hidden_states"),
                           get("pooled_projections"), get("timestep"), get("img_ids"),
                           get("txt_ids"), guided ? std::optional<at::Tensor>(get("guidance")) : std::nullopt);
  }

  Batch synthetic_batch(int64_t batch, int64_t image_tokens, int64_t text_tokens,
                        at::Generator& generator, const at::Device& device) override {
    check_synthetic_counts(kFluxName, batch, image_tokens, text_tokens);
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
    // A Kontext reference lengthens the image stream the blocks see.
    const int64_t B = in.x0.size(0), n_txt = in.prompt_embeds.size(1);
    const int64_t n_img = in.x0.size(1) + (in.reference.defined() ? in.reference.size(1) : 0);
    const auto options = in.x0.options().dtype(model_->x_embedder->weight.scalar_type());
    const auto state = [&](int64_t n) {
      return torch::randn({B, n, config.hidden_size()}, options).requires_grad_(true);
    };
    at::Tensor temb = torch::randn({B, config.hidden_size()}, options);
    if (model_->time_text_embed && any_requires_grad(*model_->time_text_embed)) temb.requires_grad_(true);
    const models::RotaryTables rope = models::flux_rope_tables(
        at::cat({in.txt_ids, in.img_ids}, 0), config.axes_dims_rope);
    // The blocks run as the model runs them in training, attention offload included.
    const std::optional<SavedTensorOffload> offload = model_->attention_offload();
    std::vector<BlockProbe> probes;
    if (config.num_layers > 0) {
      auto block = model_->transformer_blocks.front();
      probes.push_back({"flux-double",
                        [block, temb, rope, ffn, offload](int64_t, const Tensors& s) -> Tensors {
                          auto [c, x] = block.ptr()->forward(s[0], s[1], temb, rope, ffn, offload);
                          return {x, c};
                        },
                        {state(n_img), state(n_txt)},
                        trainable(*block)});
    }
    if (config.num_single_layers > 0) {
      auto block = model_->single_transformer_blocks.front();
      // With 38 or more of FLUX.1's blocks swapped, single block 0 streams: bring it in first.
      models::BlockSwap* swap = model_->block_swap();
      const int64_t global = config.num_layers;
      probes.push_back({"flux-single",
                        [block, temb, rope, ffn, swap, global, offload](int64_t, const Tensors& s) -> Tensors {
                          if (swap) swap->use(global);
                          return {block.ptr()->forward(s[0], temb, rope, ffn, offload)};
                        },
                        {state(n_txt + n_img)},
                        trainable(*block)});
    }
    return probes;
  }

 private:
  models::Flux model_;
};

std::vector<OptionSpec> flux_options() {
  std::vector<std::string> targets = models::flux_lora_target_preset_names();
  // SimpleTuner's ControlNet targets: valid names, but remat has no ControlNet branch to adapt.
  targets.push_back("controlnet");
  targets.push_back("all+ffs+embedder+controlnet");
  std::vector<OptionSpec> rows;
  rows.push_back(Opt("LoRA", "flux_lora_target", OptionType::Choice, bind_field(&TrainConfig::flux_lora_target),
                     "Which layers to train in Flux models")
                     .choices(targets)
                     .depends("model_type", "lora").depends("model_family", kFluxName)
                     .value_alias("mmdit", "default")
                     .unsupported("controlnet", "a ControlNet branch to adapt (controlnet)")
                     .unsupported("all+ffs+embedder+controlnet", "a ControlNet branch to adapt (controlnet)")
                     .tooltip("all: the attention projections of both streams; context: only the text "
                              "stream's; +ffs adds the feed-forward layers, +embedder the image input "
                              "projection; default (SimpleTuner's mmdit): the image stream's attention; "
                              "ai-toolkit adds the modulation layers; tiny and nano adapt one or two "
                              "single-block outputs.")
                     .done());
  rows.push_back(Opt("Flow matching", "flux_guidance_value", OptionType::Float,
                     bind_field(&TrainConfig::flux_guidance_value),
                     "Guidance value fed to guidance-distilled Flux models (dev, krea) during training")
                     .min(0)
                     .tooltip("SimpleTuner trains dev with 1.0 (no distilled guidance); fluxbooru always uses "
                              "3.5; ignored by models without a guidance embedder (schnell).")
                     .done());
  return rows;
}

std::string config_file(const encoders::PipelineFolder& folder, const char* component) {
  return folder.directory(component) + "/config.json";
}

// FluxPipeline's scheduler: the folder's, else Black Forest Labs' published one (schnell's
// constant shift for the schnell flavour, dev's dynamic shifting for the others).
sample::FlowMatchSchedulerConfig flux_scheduler(const encoders::PipelineFolder& folder, const std::string& flavour) {
  if (folder.components.count("scheduler")) {
    return sample::FlowMatchSchedulerConfig::from_json_file(folder.directory("scheduler") + "/scheduler_config.json");
  }
  return flavour == "schnell" ? sample::FlowMatchSchedulerConfig::flux_schnell()
                              : sample::FlowMatchSchedulerConfig::flux_dev();
}

// The three models must agree on the widths they exchange; a folder assembled from different
// models would otherwise fail deep inside the first transformer call.
void check_flux_pipeline(const encoders::PipelineFolder& folder, const TransformerSpec& spec) {
  const auto config = flux_config_of(spec);
  const auto vae = encoders::AutoencoderKLConfig::from_file(config_file(folder, "vae"));
  if (vae.latent_channels * 4 != config.in_channels) {
    throw_value_error("[sample] '" + folder.root + "': vae/config.json has latent_channels " +
                      std::to_string(vae.latent_channels) + " but the transformer takes in_channels " +
                      std::to_string(config.in_channels) + " (4 latent channels per 2x2 patch); the components "
                      "come from different models");
  }
  const auto t5 = encoders::T5Config::from_file(config_file(folder, "text_encoder_2"));
  if (t5.d_model != config.joint_attention_dim) {
    throw_value_error("[sample] '" + folder.root + "': text_encoder_2/config.json has d_model " +
                      std::to_string(t5.d_model) + " but the transformer's joint_attention_dim is " +
                      std::to_string(config.joint_attention_dim) + "; the components come from different models");
  }
  const auto clip = encoders::ClipTextConfig::from_file(config_file(folder, "text_encoder"));
  if (clip.hidden_size != config.pooled_projection_dim) {
    throw_value_error("[sample] '" + folder.root + "': text_encoder/config.json has hidden_size " +
                      std::to_string(clip.hidden_size) + " but the transformer's pooled_projection_dim is " +
                      std::to_string(config.pooled_projection_dim) + "; the components come from different models");
  }
}

}  // namespace

void register_family_flux() {
  ModelFamily f;
  f.name = kFluxName;
  f.display_name = "Flux.1";
  f.flavour_specs = flux_flavours();
  f.flavour_aliases = {{"flux-dev", "dev"}, {"flux-schnell", "schnell"}};
  f.default_flavour = "krea";
  f.small_flavour = "flux-tiny";
  f.apply_flavour = apply_flux_flavour;
  f.latents = LatentLayout{kFluxName, /*channels=*/16, /*spatial_multiple=*/2, /*pooled=*/true,
                           /*variable_text_length=*/false};
  f.encoders = encoders::flux_family_encoders();  // CLIP-L, T5 and the VAE (remat/encoders/flux_encoders.h)
  f.pipeline_classes = {"FluxPipeline", "FluxKontextPipeline"};
  f.picture_editing_pipeline_classes = {"FluxKontextPipeline"};
  f.max_sequence_length = 512;  // FluxPipeline.check_inputs
  f.scheduler = flux_scheduler;
  f.check_pipeline = check_flux_pipeline;
  f.write_demo_pipeline = encoders::write_demo_pipeline;
  f.checkpointing = {/*interval=*/true, /*segment_stride=*/true, /*ffn_scope=*/true,
                     {"double blocks", "single blocks"}, /*block_swap=*/true,
                     {"transformer_blocks", "single_transformer_blocks"}, /*attention_offload=*/true};
  f.lora_target_presets = models::flux_lora_target_preset_names();
  f.lora_target_modules = models::flux_lora_target_modules;
  f.lora_target_of = [](const TrainConfig& config) { return config.flux_lora_target; };
  f.options = flux_options;
  f.build = [](const TransformerSpec& spec, const c10::Device& device) -> std::unique_ptr<Transformer> {
    return std::make_unique<FluxTransformer>(spec, device);
  };
  f.conditioning = [](const TransformerSpec& spec) {
    const auto config = flux_config_of(spec);
    // 2x2 packing: the model's in_channels are 4 latent channels per token.
    return ConditioningWidths{config.joint_attention_dim, config.pooled_projection_dim,
                              config.in_channels % 4 == 0 ? config.in_channels / 4 : 0};
  };
  f.parameter_count = [](const TransformerSpec& spec) { return models::parameter_count(flux_config_of(spec)); };
  f.linear_layers = [](const TransformerSpec& spec) { return models::linear_layers(flux_config_of(spec)); };
  f.attention_layers = [](const TransformerSpec& spec) {
    // Double and single blocks alike attend over the text and image tokens joined.
    const auto config = flux_config_of(spec);
    return AttentionLayers{config.num_layers + config.num_single_layers, config.num_attention_heads};
  };
  f.plan_proxy = flux_plan_proxy;
  register_family(std::move(f));
}

}  // namespace remat::train::families
