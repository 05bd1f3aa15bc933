#pragma once
/// \file
/// What sampling shares across model families: one prompt's embeddings, the settings of one
/// picture, the Denoiser a family's transformer samples through, and the conversion of decoded
/// pictures to 8-bit pixels.

#include <cstdint>
#include <functional>
#include <memory>

#include <ATen/Tensor.h>

#include "remat/encoders/model_encoders.h"
#include "remat/export.h"

namespace remat::sample {

/// One prompt, encoded (remat/encoders/model_encoders.h EncodedPrompt, without batch dim).
struct PromptEmbeddings {
  at::Tensor prompt_embeds;         ///< the text encoder's hidden states (N_t, width) (Flux: T5's)
  at::Tensor pooled_prompt_embeds;  ///< a pooled vector (width) (Flux: CLIP's); undefined when the family has none
};

/// Bounds of a sample's size and step count: remat decodes and writes pictures of at most
/// 8192 x 8192 (the picture bound of remat::encoders' readers; FLUX.1 is trained up to about
/// 2 megapixels), and FluxPipeline's schedules use 1 to a few hundred steps.
inline constexpr int64_t kMaxSampleSide = 8192;
inline constexpr int64_t kMaxInferenceSteps = 10000;

/// What one picture is sampled with.
struct SamplingSettings {
  int64_t width = 1024;   ///< pixels, a multiple of 2 vae_scale_factor, at most kMaxSampleSide
  int64_t height = 1024;  ///< pixels, a multiple of 2 vae_scale_factor, at most kMaxSampleSide
  int64_t num_inference_steps = 28;  ///< in [1, kMaxInferenceSteps]
  /// The embedded guidance of guidance-distilled models (transformer config guidance_embeds);
  /// ignored by models without it.
  double guidance_scale = 3.5;
  /// True classifier-free guidance: > 1 with a negative prompt runs a second transformer pass per
  /// step and uses v_neg + scale (v_pos - v_neg).
  double true_cfg_scale = 1.0;
  /// Real CFG only from this step index on (SimpleTuner's validation_no_cfg_until_timestep).
  int64_t no_cfg_until_step = 0;
  /// Seed of the CPU generator the initial noise is drawn from (same seed, same picture).
  uint64_t seed = 0;
  /// Pixels per latent pixel of the VAE that decodes the result: 2^(len(block_out_channels) - 1),
  /// 8 for FLUX.1's VAE (encoders::ImageAutoencoder::vae_scale_factor). FluxPipeline sizes the latent
  /// grid from it; width and height must also be multiples of 2 f.
  int64_t vae_scale_factor = 8;
  /// FLUX.1 Kontext: the input picture's latents (C, h, w) with h and w even, normalised as the
  /// sampled latents are ((z - shift_factor) * scaling_factor). Each step appends them, packed,
  /// after the noisy latents with position ids whose first coordinate is 1, and keeps the
  /// prediction of the noisy tokens only (diffusers' FluxKontextPipeline). Undefined: none.
  at::Tensor reference_latents;
};

/// Called after each denoising step with (steps done, total steps).
using StepCallback = std::function<void(int64_t, int64_t)>;

/// A transformer ready to sample with: its family's denoising loop (Flux's:
/// remat/sample/flux_sampler.h) on a model that is already built, with the scheduler it was made
/// with. `remat sample` (remat/sample/pipeline.h), validation during training and the demo's
/// quality check all sample through one.
class REMAT_API Denoiser {
 public:
  virtual ~Denoiser() = default;
  /// The denoising loop from the noise of settings.seed (drawn on a private CPU generator: no
  /// global random state moves) to the final latents (C, h, w) in float32 on the CPU, in the
  /// transformer's latent space. Gradients are not recorded; the model's training / eval mode and
  /// LoRA branches are used as they are. `negative` is used only when settings.true_cfg_scale > 1.
  /// Throws c10::ValueError for sizes or embeddings that do not fit the model.
  virtual at::Tensor denoise(const PromptEmbeddings& positive, const PromptEmbeddings* negative,
                             const SamplingSettings& settings, const StepCallback& on_step = {}) = 0;
};

/// A Denoiser whose denoise calls `loop` (a family's denoising loop bound to its model and scheduler).
using DenoisingLoop = std::function<at::Tensor(const PromptEmbeddings& positive, const PromptEmbeddings* negative,
                                               const SamplingSettings& settings, const StepCallback& on_step)>;
REMAT_API std::unique_ptr<Denoiser> make_denoiser(DenoisingLoop loop);

/// diffusers' VaeImageProcessor.postprocess to PIL: a decoded picture (1, 3, H, W) or (3, H, W),
/// roughly in [-1, 1], -> (x * 0.5 + 0.5).clamp(0, 1) in its dtype, then * 255 in float32 rounded
/// half to even -> uint8 (H, W, 3) on the CPU.
REMAT_API at::Tensor to_uint8_image(const at::Tensor& decoded);
/// The same picture converted as `conversion` says (encoders::ImageAutoencoder::pixel_conversion):
/// PixelConversion::clamp_truncate is SimpleTuner's MageFlow pipeline (_tokens_to_image):
/// x.clamp(-1, 1), then 127.5 (x + 1) in the picture's dtype, truncated to uint8.
REMAT_API at::Tensor to_uint8_image(const at::Tensor& decoded, encoders::PixelConversion conversion);

}  // namespace remat::sample
