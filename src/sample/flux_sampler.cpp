// The denoising loop of diffusers' FluxPipeline.__call__ (pipelines/flux/pipeline_flux.py), with
// FluxKontextPipeline.__call__'s reference latents (pipelines/flux/pipeline_flux_kontext.py).

#include "remat/sample/flux_sampler.h"

#include <string>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "remat/util/error.h"

namespace remat::sample {
namespace {

// FluxPipeline.check_inputs (diffusers/pipelines/flux/pipeline_flux.py): sides divisible by
// vae_scale_factor * 2 (16 with FLUX.1's VAE).
void check_size(const char* what, int64_t pixels, int64_t vae_scale_factor) {
  if (pixels < 1 || pixels % (2 * vae_scale_factor) != 0) {
    throw_value_error(std::string("[sample] ") + what + " must be a multiple of " +
                      std::to_string(2 * vae_scale_factor) + " (this VAE downsamples " +
                      std::to_string(vae_scale_factor) + "x, then Flux packs 2x2 latent patches), got " +
                      std::to_string(pixels));
  }
}

void check_embeddings(const PromptEmbeddings& e, const char* which, const models::FluxConfig& config) {
  if (!e.prompt_embeds.defined() || e.prompt_embeds.dim() != 2 || e.prompt_embeds.size(0) < 1 ||
      e.prompt_embeds.size(1) != config.joint_attention_dim) {
    throw_value_error(std::string("[sample] ") + which + " prompt_embeds must be (N_t, " +
                      std::to_string(config.joint_attention_dim) +
                      ") for this transformer (joint_attention_dim), got " +
                      (e.prompt_embeds.defined() ? c10::str(e.prompt_embeds.sizes()) : std::string("none")));
  }
  if (!e.pooled_prompt_embeds.defined() || e.pooled_prompt_embeds.dim() != 1 ||
      e.pooled_prompt_embeds.size(0) != config.pooled_projection_dim) {
    throw_value_error(std::string("[sample] ") + which + " pooled_prompt_embeds must be (" +
                      std::to_string(config.pooled_projection_dim) +
                      ") for this transformer (pooled_projection_dim), got " +
                      (e.pooled_prompt_embeds.defined() ? c10::str(e.pooled_prompt_embeds.sizes())
                                                        : std::string("none")));
  }
}

// The transformer's inputs for one prompt, with the batch dim, on the model's device and dtype.
struct TextInputs {
  at::Tensor embeds, pooled, ids;
};

TextInputs text_inputs(const PromptEmbeddings& e, const at::TensorOptions& model) {
  TextInputs t;
  t.embeds = e.prompt_embeds.unsqueeze(0).to(model);
  t.pooled = e.pooled_prompt_embeds.unsqueeze(0).to(model);
  t.ids = models::flux_text_ids(e.prompt_embeds.size(0)).to(model);
  return t;
}

}  // namespace

at::Tensor denoise(models::FluxImpl& transformer, const FlowMatchSchedulerConfig& scheduler,
                   const PromptEmbeddings& positive, const PromptEmbeddings* negative,
                   const SamplingSettings& settings, const StepCallback& on_step) {
  const models::FluxConfig& config = transformer.config();
  if (settings.vae_scale_factor < 1) {
    throw_value_error("[sample] vae_scale_factor must be >= 1, got " + std::to_string(settings.vae_scale_factor));
  }
  check_size("width", settings.width, settings.vae_scale_factor);
  check_size("height", settings.height, settings.vae_scale_factor);
  if (settings.num_inference_steps < 1) {
    throw_value_error("[sample] num_inference_steps must be >= 1, got " +
                      std::to_string(settings.num_inference_steps));
  }
  if (config.patch_size != 1 || config.in_channels % 4 != 0) {
    throw_value_error("[sample] the transformer must take 2x2-packed latents (patch_size 1, in_channels a "
                      "multiple of 4), got patch_size " + std::to_string(config.patch_size) + ", in_channels " +
                      std::to_string(config.in_channels));
  }
  check_embeddings(positive, "positive", config);
  const at::Tensor& reference = settings.reference_latents;
  if (reference.defined() && (reference.dim() != 3 || reference.size(0) != config.in_channels / 4 ||
                              reference.size(1) < 2 || reference.size(2) < 2 || reference.size(1) % 2 != 0 ||
                              reference.size(2) % 2 != 0)) {
    throw_value_error("[sample] reference_latents (Kontext's input picture) must be (" +
                      std::to_string(config.in_channels / 4) + ", h, w) with h and w even, got " +
                      c10::str(reference.sizes()));
  }
  const bool true_cfg = settings.true_cfg_scale > 1.0 && negative != nullptr;
  if (true_cfg) check_embeddings(*negative, "negative", config);

  torch::NoGradGuard no_grad;
  const at::Tensor& model_weight = transformer.x_embedder->weight;
  const auto model = at::TensorOptions().device(model_weight.device()).dtype(model_weight.scalar_type());
  // Latents live in the text encoder's dtype, like diffusers' prepare_latents
  // (FluxPipeline.__call__ passes prompt_embeds.dtype).
  const auto latent_dtype = positive.prompt_embeds.scalar_type();

  // Noise on a private CPU generator (bit-identical to torch.randn with the same seed), so no
  // global random state moves: validation during training must not shift the training stream.
  const int64_t channels = config.in_channels / 4;
  // FluxPipeline.prepare_latents: 2 * (H // (2 f)), exact here since H is a multiple of 2 f.
  const int64_t f = settings.vae_scale_factor;
  const int64_t h = 2 * (settings.height / (2 * f)), w = 2 * (settings.width / (2 * f));
  at::Generator generator = at::detail::createCPUGenerator(settings.seed);
  const at::Tensor noise = at::randn({1, channels, h, w}, generator, at::TensorOptions().dtype(latent_dtype));
  at::Tensor latents = models::flux_pack_latents(noise).to(model_weight.device());
  // The schedule's shift follows the sampled tokens alone, as FluxKontextPipeline's mu does.
  const int64_t image_seq_len = latents.size(1);
  at::Tensor img_ids = models::flux_image_ids(h / 2, w / 2).to(model);
  // Kontext: the picture's packed latents, in the latents' dtype (prepare_latents casts the
  // encoded picture to prompt_embeds.dtype), and its ids: the latent ids with id[..., 0] = 1.
  at::Tensor reference_tokens;
  if (reference.defined()) {
    reference_tokens = models::flux_pack_latents(reference.unsqueeze(0).to(latent_dtype)).to(model_weight.device());
    const at::Tensor reference_ids = models::flux_reference_ids(reference.size(1) / 2, reference.size(2) / 2);
    img_ids = at::cat({img_ids, reference_ids.to(model)}, 0);
  }

  const FlowMatchSchedule schedule = flow_match_schedule(scheduler, settings.num_inference_steps, image_seq_len);
  const at::Tensor timesteps = schedule.timesteps.to(model_weight.device());
  std::optional<at::Tensor> guidance;
  if (config.guidance_embeds) {
    guidance = at::full({1}, settings.guidance_scale, at::TensorOptions().dtype(at::kFloat).device(model.device()));
  }

  const TextInputs pos = text_inputs(positive, model);
  TextInputs neg;
  if (true_cfg) neg = text_inputs(*negative, model);

  const int64_t steps = schedule.steps();
  for (int64_t i = 0; i < steps; ++i) {
    // diffusers: t.expand(B).to(latents.dtype) / 1000; the model multiplies by 1000 again.
    const at::Tensor timestep = (timesteps[i].expand({1}).to(latent_dtype) / 1000).to(model);
    const at::Tensor x = reference_tokens.defined() ? at::cat({latents, reference_tokens}, 1).to(model) : latents.to(model);
    // Kontext: noise_pred[:, : latents.size(1)], the sampled tokens' prediction.
    const auto predict = [&](const TextInputs& text) {
      const at::Tensor out = transformer.forward(x, text.embeds, text.pooled, timestep, img_ids, text.ids, guidance);
      return reference_tokens.defined() ? out.slice(1, 0, image_seq_len) : out;
    };
    at::Tensor v = predict(pos);
    if (true_cfg && i >= settings.no_cfg_until_step) {
      const at::Tensor v_neg = predict(neg);
      v = v_neg + settings.true_cfg_scale * (v - v_neg);
    }
    // Same dtype as the latents (diffusers' pipelines run the text encoders and the transformer in
    // one dtype, where this cast does nothing).
    latents = flow_match_euler_step(latents, v.to(latent_dtype), schedule, i);
    if (on_step) on_step(i + 1, steps);
  }
  return models::flux_unpack_latents(latents, h, w).squeeze(0).to(at::kCPU, at::kFloat).contiguous();
}

std::unique_ptr<Denoiser> flux_denoiser(models::FluxImpl& transformer, const FlowMatchSchedulerConfig& scheduler) {
  return make_denoiser([&transformer, scheduler](const PromptEmbeddings& positive, const PromptEmbeddings* negative,
                                                 const SamplingSettings& settings, const StepCallback& on_step) {
    return denoise(transformer, scheduler, positive, negative, settings, on_step);
  });
}

}  // namespace remat::sample
