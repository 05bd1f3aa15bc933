#pragma once
/// \file
/// Flux.1's denoising loop (diffusers' FluxPipeline.__call__ in
/// src/diffusers/pipelines/flux/pipeline_flux.py) on a transformer that is already built, and the
/// Denoiser (remat/sample/sampler.h) the Flux family samples through.

#include <memory>

#include <ATen/Tensor.h>

#include "remat/export.h"
#include "remat/models/flux.h"
#include "remat/sample/sampler.h"
#include "remat/sample/scheduler.h"

namespace remat::sample {

/// FluxPipeline's denoising loop on `transformer` (any dtype, any device; its current training /
/// eval mode and LoRA branches are used as they are; gradients are not recorded). The initial noise
/// (1, C, H / f, W / f), f = settings.vae_scale_factor, is drawn on the CPU from a generator
/// seeded with settings.seed, in the dtype of positive.prompt_embeds, then moved to the
/// transformer's device;
/// no global random state is touched. `negative` is used only when settings.true_cfg_scale > 1.
/// Returns the final latents (C, h, w) in float32 on the CPU, in the transformer's latent space
/// (before the VAE's scaling and shift). Throws c10::ValueError for a width or height that is not
/// a positive multiple of 16 and of 2 f, embeddings that do not fit the transformer, or steps < 1.
REMAT_API at::Tensor denoise(models::FluxImpl& transformer, const FlowMatchSchedulerConfig& scheduler,
                             const PromptEmbeddings& positive, const PromptEmbeddings* negative,
                             const SamplingSettings& settings, const StepCallback& on_step = {});

/// A Denoiser running `denoise` on `transformer` (which must outlive it) with `scheduler`.
REMAT_API std::unique_ptr<Denoiser> flux_denoiser(models::FluxImpl& transformer,
                                                  const FlowMatchSchedulerConfig& scheduler);

}  // namespace remat::sample
