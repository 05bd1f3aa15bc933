#pragma once
/// \file
/// Flux.1's three encoders loaded from a diffusers pipeline folder, doing what FluxPipeline does
/// with them: a caption becomes T5's hidden states (`prompt_embeds`, the transformer's
/// encoder_hidden_states) and CLIP's pooled output (`pooled_prompt_embeds`); a picture becomes the
/// VAE posterior's sample (or mean) in the transformer's latent space, (z - shift) * scale.
/// The results are exactly the tensors of a latent-cache sample (remat/train/data/data.h), so
/// `remat encode` output trains as it is.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "remat/encoders/autoencoder_kl.h"
#include "remat/encoders/clip_text_model.h"
#include "remat/encoders/clip_tokenizer.h"
#include "remat/encoders/model_encoders.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/encoders/t5_encoder.h"
#include "remat/encoders/t5_tokenizer.h"
#include "remat/export.h"

namespace remat::encoders {

struct FluxEncodersOptions {
  /// Weights and computation dtype: bfloat16 (as the published files) or float32.
  at::ScalarType dtype = at::kBFloat16;
  /// T5's token count (SimpleTuner's tokenizer_max_length; FluxPipeline's max_sequence_length:
  /// 512 for dev, 256 for schnell). Captions are padded or truncated to it.
  int64_t max_sequence_length = 512;
  /// Where the encoders run (loaded on the CPU, then moved). Results come back to the CPU either
  /// way: they are what the caches store and what the sampler takes.
  at::Device device = at::kCPU;
  bool load_vae = true;   ///< vae/
  bool load_text = true;  ///< text_encoder/, text_encoder_2/, tokenizer/, tokenizer_2/
};

/// The components FluxEncoders::load needs for `options` (for PipelineFolder::open).
REMAT_API std::vector<std::string> flux_encoder_components(const FluxEncodersOptions& options);

/// One caption, encoded.
struct FluxPromptEmbeddings {
  at::Tensor prompt_embeds;         ///< (max_sequence_length, T5 d_model), in the encoders' dtype
  at::Tensor pooled_prompt_embeds;  ///< (CLIP hidden_size), in the encoders' dtype
  std::vector<int64_t> clip_ids;    ///< the 77 CLIP ids (bos, content, eos, padding)
  std::vector<int64_t> t5_ids;      ///< the T5 ids (content, </s>, padding)
  int64_t clip_content_tokens = 0;  ///< caption tokens CLIP kept (without bos / eos)
  int64_t t5_content_tokens = 0;    ///< caption tokens T5 kept (without </s>)
  /// diffusers' truncation warnings, one per encoder that cut the caption.
  std::vector<std::string> warnings;
};

/// What loading one component cost.
struct LoadedComponent {
  std::string name;       ///< "vae", "text_encoder", "text_encoder_2"
  std::string directory;
  int64_t parameters = 0;
  int64_t bytes = 0;      ///< parameter bytes in the loaded dtype
};

/// Flux.1's encoders: CLIP-L and T5 for captions, its AutoencoderKL for pictures.
class REMAT_API FluxEncoders final : public PromptEncoder, public ImageAutoencoder {
 public:
  /// Loads the selected components of `folder` (opened with at least flux_encoder_components)
  /// strictly, each from its config.json straight into options.dtype. Errors name the file and
  /// the key (c10::ValueError).
  static FluxEncoders load(const PipelineFolder& folder, const FluxEncodersOptions& options);

  /// FluxPipeline.encode_prompt for one caption: CLIP ids padded to 77 -> pooled output; T5 ids
  /// padded to max_sequence_length -> last hidden state. Neither encoder is given an attention
  /// mask (FluxPipeline gives none). Needs the text encoders.
  FluxPromptEmbeddings encode_prompt(const std::string& caption);
  /// encode_prompt's embeddings and warnings.
  EncodedPrompt encode_caption(const std::string& caption) override;

  /// VAE input (1, 3, H, W) in [-1, 1] -> transformer latents (C, H / f, W / f) in float32,
  /// f = vae_scale_factor(): the posterior's sample drawn from `generator`, or its mean when none
  /// is given. H and W must be multiples of 2 f (Flux packs 2 x 2 latent patches).
  at::Tensor encode_image(const at::Tensor& vae_input, c10::optional<at::Generator> generator) override;

  /// Transformer latents (C, h, w) -> decoded image (1, 3, f h, f w), roughly in [-1, 1].
  at::Tensor decode_latents(const at::Tensor& latents) override;
  /// The VAE decodes and encodes in tiles (has_vae() only).
  void set_tiling(bool tiled) override;

  /// 2^(levels - 1): pixels per latent pixel (8 for Flux's VAE).
  int64_t vae_scale_factor() const override;
  bool has_vae() const { return !vae_.is_empty(); }
  bool has_text() const { return !clip_.is_empty(); }
  /// The VAE, to set tiling or slicing (has_vae() only).
  AutoencoderKL& vae();

  const std::vector<LoadedComponent>& loaded() const { return loaded_; }
  const FluxEncodersOptions& options() const { return options_; }

 private:
  FluxEncodersOptions options_;
  AutoencoderKL vae_{nullptr};
  ClipTextModel clip_{nullptr};
  T5EncoderModel t5_{nullptr};
  std::optional<ClipTokenizer> clip_tokenizer_;
  std::optional<T5Tokenizer> t5_tokenizer_;
  std::vector<LoadedComponent> loaded_;
};

/// Flux.1's encoders for code that runs any family's (remat/encoders/model_encoders.h): text from
/// text_encoder/ + tokenizer/ (CLIP) and text_encoder_2/ + tokenizer_2/ (T5), pictures from vae/.
REMAT_API FamilyEncoders flux_family_encoders();

}  // namespace remat::encoders
