// The denoising loop of SimpleTuner's MageFlowPipeline.__call__ (simpletuner/helpers/models/mageflow/
// pipeline.py at bc8e6ab7: _set_scheduler_timesteps, _mageflow_velocity, _optimized_scale).

#include "remat/sample/mageflow_sampler.h"

#include <string>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "remat/util/error.h"

namespace remat::sample {
namespace {

void check_mageflow_size(const char* what, int64_t pixels, int64_t f) {
  if (pixels < 1 || pixels % f != 0) {
    throw_value_error(std::string("[sample] ") + what + " must be a positive multiple of " + std::to_string(f) +
                      " (the VAE's " + std::to_string(f) + "x downsampling; MageFlow reads one token per latent pixel), got " +
                      std::to_string(pixels));
  }
}

void check_mageflow_embeddings(const PromptEmbeddings& e, const char* which, const models::MageFlowConfig& config) {
  if (!e.prompt_embeds.defined() || e.prompt_embeds.dim() != 2 || e.prompt_embeds.size(0) < 1 ||
      e.prompt_embeds.size(1) != config.context_in_dim) {
    throw_value_error(std::string("[sample] ") + which + " prompt_embeds must be (N_t, " +
                      std::to_string(config.context_in_dim) + ") for this transformer (context_in_dim), got " +
                      (e.prompt_embeds.defined() ? c10::str(e.prompt_embeds.sizes()) : std::string("none")));
  }
}

// _optimized_scale under float32 autocast: the projection of v_pos on v_neg over every element.
at::Tensor optimized_scale(const at::Tensor& positive, const at::Tensor& negative) {
  const at::Tensor p = positive.reshape({1, -1}).to(at::kFloat), n = negative.reshape({1, -1}).to(at::kFloat);
  const at::Tensor dot = (p * n).sum(1, /*keepdim=*/true);
  const at::Tensor squared_norm = (n * n).sum(1, /*keepdim=*/true) + 1e-8;
  return dot / squared_norm;
}

}  // namespace

FlowMatchSchedulerConfig mageflow_default_scheduler() {
  FlowMatchSchedulerConfig c;
  c.num_train_timesteps = 1000;
  c.shift = 6.0;
  c.use_dynamic_shifting = false;
  return c;
}

FlowMatchSchedule mageflow_schedule(const FlowMatchSchedulerConfig& scheduler, int64_t num_inference_steps) {
  if (num_inference_steps < 1) {
    throw_value_error("[sample] num_inference_steps must be >= 1, got " + std::to_string(num_inference_steps));
  }
  if (scheduler.use_dynamic_shifting) {
    throw_value_error("[sample] the scheduler config has use_dynamic_shifting true, but MageFlow's pipeline sets its "
                      "timesteps without a resolution shift (mu); use a config with a constant shift");
  }
  const at::Tensor linspace = at::linspace(1.0, 1.0 / static_cast<double>(num_inference_steps), num_inference_steps,
                                           at::TensorOptions().dtype(at::kFloat));
  const float* data = linspace.data_ptr<float>();
  return flow_match_schedule_from_sigmas(scheduler, std::vector<float>(data, data + num_inference_steps),
                                         /*image_seq_len=*/1);
}

at::Tensor denoise(models::MageFlowImpl& transformer, const FlowMatchSchedulerConfig& scheduler,
                   const PromptEmbeddings& positive, const PromptEmbeddings* negative,
                   const SamplingSettings& settings, const StepCallback& on_step) {
  const models::MageFlowConfig& config = transformer.config();
  const int64_t f = settings.vae_scale_factor;
  if (f < 1) throw_value_error("[sample] vae_scale_factor must be >= 1, got " + std::to_string(f));
  check_mageflow_size("width", settings.width, f);
  check_mageflow_size("height", settings.height, f);
  if (config.patch_size != 1) {
    throw_value_error("[sample] MageFlow sampling reads one token per latent pixel (patch_size 1), got patch_size " +
                      std::to_string(config.patch_size));
  }
  if (settings.reference_latents.defined()) {
    throw_value_error("[sample] MageFlow's edit pipeline (reference pictures) is not implemented; sample from text");
  }
  check_mageflow_embeddings(positive, "positive", config);
  const bool cfg = settings.true_cfg_scale > 1.0 && negative != nullptr;
  if (cfg) check_mageflow_embeddings(*negative, "negative", config);
  const FlowMatchSchedule schedule = mageflow_schedule(scheduler, settings.num_inference_steps);

  torch::NoGradGuard no_grad;
  const at::Tensor& weight = transformer.img_in->weight;
  const auto model = at::TensorOptions().device(weight.device()).dtype(weight.scalar_type());
  const int64_t h = settings.height / f, w = settings.width / f, channels = config.in_channels;
  // torch.randn(1, C, h, w, dtype=transformer dtype, generator) on a private CPU generator: no
  // global random state moves. Then "b c h w -> 1 (b h w) c".
  at::Generator generator = at::detail::createCPUGenerator(settings.seed);
  const at::Tensor noise = at::randn({1, channels, h, w}, generator, at::TensorOptions().dtype(weight.scalar_type()));
  at::Tensor tokens = noise.permute({0, 2, 3, 1}).reshape({1, h * w, channels}).to(model);

  // One packed sample, or with CFG the pipeline's fused pass (_build_pack_ctx with batch_cfg True,
  // as MageFlowPipeline.__call__ always builds it): the image tokens twice, the positive then the
  // negative text, as two samples of one forward. Not the same as two forwards: the RoPE tables
  // number the samples of a pack (MageFlowEmbedRope._compute_video_freqs), so the unconditional
  // half's tokens sit at frame position 1.
  const int64_t L = h * w, n = cfg ? 2 : 1;
  const at::Tensor pos_txt = positive.prompt_embeds.to(model);
  const at::Tensor txt = (cfg ? at::cat({pos_txt, negative->prompt_embeds.to(model)}, 0) : pos_txt).unsqueeze(0);
  std::vector<int32_t> img_offsets{0}, txt_offsets{0, static_cast<int32_t>(pos_txt.size(0))};
  for (int64_t k = 0; k < n; ++k) img_offsets.push_back(static_cast<int32_t>((k + 1) * L));
  if (cfg) txt_offsets.push_back(static_cast<int32_t>(txt.size(1)));
  const at::Tensor img_cu = torch::tensor(img_offsets, at::kInt).to(weight.device());
  const at::Tensor txt_cu = torch::tensor(txt_offsets, at::kInt).to(weight.device());
  const std::vector<models::ImageShape> shapes(static_cast<size_t>(n), models::ImageShape{1, h, w});

  const int64_t steps = schedule.steps();
  for (int64_t i = 0; i < steps; ++i) {
    // _transformer_velocity: torch.full((na,), sigma, dtype=img.dtype), one per packed sample.
    const at::Tensor t = at::full({n}, schedule.sigmas[i].item<float>(), model);
    const at::Tensor x = tokens.to(model);
    const at::Tensor out = transformer.forward(cfg ? at::cat({x, x}, 1) : x, txt, t, shapes, img_cu, txt_cu);
    at::Tensor v = out.narrow(1, 0, L);
    if (cfg) {
      const at::Tensor v_neg = out.narrow(1, L, L);
      const at::Tensor alpha = optimized_scale(v, v_neg).view({1, 1, 1}).to(v.scalar_type());
      v = v_neg * alpha + settings.true_cfg_scale * (v - v_neg * alpha);
    }
    tokens = flow_match_euler_step(tokens, v, schedule, i);
    if (on_step) on_step(i + 1, steps);
  }
  // _unpack_tokens(tokens.float()): "b (h w) c -> b c h w".
  return tokens.to(at::kFloat).reshape({h, w, channels}).permute({2, 0, 1}).to(at::kCPU).contiguous();
}

std::unique_ptr<Denoiser> mageflow_denoiser(models::MageFlowImpl& transformer,
                                            const FlowMatchSchedulerConfig& scheduler) {
  return make_denoiser([&transformer, scheduler](const PromptEmbeddings& positive, const PromptEmbeddings* negative,
                                                 const SamplingSettings& settings, const StepCallback& on_step) {
    return denoise(transformer, scheduler, positive, negative, settings, on_step);
  });
}

}  // namespace remat::sample
