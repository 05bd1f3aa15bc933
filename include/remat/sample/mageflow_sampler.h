#pragma once
/// \file
/// MageFlow's denoising loop as SimpleTuner's MageFlowPipeline.__call__ runs it
/// (simpletuner/helpers/models/mageflow/pipeline.py at bc8e6ab7) on a transformer that is already
/// built, and the Denoiser (remat/sample/sampler.h) the MageFlow family samples through:
///  - noise (1, C, H / f, W / f) from a CPU generator seeded with settings.seed, in the
///    transformer's dtype, as image tokens (h w, C) of one packed sample;
///  - the schedule from input sigmas torch.linspace(1, 1/N, N) in float32, shifted by the
///    scheduler's constant shift (6 in MageFlowPipeline's default scheduler), a final 0 appended;
///  - each step the transformer's velocity at timesteps = sigma in the transformer's dtype; with a
///    negative prompt and a CFG scale above 1 (SamplingSettings::true_cfg_scale: the pipeline's
///    guidance_scale) one fused forward of two packed samples, the positive and the negative text
///    (the pipeline's batch_cfg pass, whose RoPE puts the second sample at frame position 1), then
///    CFG-Zero*, the pipeline's default: alpha = <v_pos, v_neg> / (|v_neg|^2 + 1e-8) over every
///    element in float32, v = alpha v_neg + scale (v_pos - alpha v_neg);
///  - the Euler step of FlowMatchEulerDiscreteScheduler (float32 sum, the velocity's dtype after).
/// Not implemented (the pipeline's options that are off by default): skip-layer guidance,
/// guidance_rescale, CFG renormalisation, batched prompts. settings.no_cfg_until_step is ignored,
/// as the pipeline ignores it; settings.guidance_scale (embedded guidance) does not exist here.

#include <memory>
#include <vector>

#include <ATen/Tensor.h>

#include "remat/export.h"
#include "remat/models/mageflow.h"
#include "remat/sample/sampler.h"
#include "remat/sample/scheduler.h"

namespace remat::sample {

/// MageFlowPipeline._set_scheduler_timesteps: input sigmas torch.linspace(1, 1/N, N) (float32),
/// shifted by `scheduler` (which must not use dynamic shifting: the pipeline passes no mu).
/// Throws c10::ValueError for N < 1 or a dynamic-shifting scheduler.
REMAT_API FlowMatchSchedule mageflow_schedule(const FlowMatchSchedulerConfig& scheduler, int64_t num_inference_steps);

/// MageFlowPipeline's default scheduler when the folder has none: FlowMatchEulerDiscreteScheduler
/// with shift 6.0 and no dynamic shifting (pipeline.py _load_scheduler).
REMAT_API FlowMatchSchedulerConfig mageflow_default_scheduler();

/// The loop of the file comment on `transformer` (any dtype and device; its mode and LoRA branches
/// as they are; no gradients). Returns the final latents (C, h, w) in float32 on the CPU. Throws
/// c10::ValueError for sizes that are not positive multiples of settings.vae_scale_factor,
/// embeddings that are not (N_t, context_in_dim), or steps < 1.
REMAT_API at::Tensor denoise(models::MageFlowImpl& transformer, const FlowMatchSchedulerConfig& scheduler,
                             const PromptEmbeddings& positive, const PromptEmbeddings* negative,
                             const SamplingSettings& settings, const StepCallback& on_step = {});

/// A Denoiser running `denoise` on `transformer` (which must outlive it) with `scheduler`.
REMAT_API std::unique_ptr<Denoiser> mageflow_denoiser(models::MageFlowImpl& transformer,
                                                      const FlowMatchSchedulerConfig& scheduler);

}  // namespace remat::sample
