#pragma once
/// \file
/// Validation images during training, with SimpleTuner's options (docs/OPTIONS.md, "Validation
/// images"): every validation_step_interval optimizer steps, and once before the first step of a
/// fresh run, the live training transformer (eval mode, its LoRA applied, no gradients) renders
/// every validation prompt at every validation resolution with its family's denoiser
/// (Transformer::denoiser, remat/sample/sampler.h); the pipeline's autoencoder
/// decodes them into output_dir/validation_images/step_{step}_{shortname}_{idx}_{W}x{H}.png (the
/// names SimpleTuner gives them) and index.html shows all of them side by side, one row per step.
///
/// Note [Validation and the training run]
///  - Random state: every picture's noise comes from its own CPU generator seeded with
///    validation_seed or seed or 0; loading an encoder initialises modules from the global CPU
///    generator, so that generator's state is saved and restored around every load. Nothing of
///    validation draws from the training noise generator, so a run with validation trains bit for
///    bit as one without, and exact resume stays exact.
///  - Memory: the prompts are encoded once at start (text encoders loaded, used, freed); only the
///    embeddings stay (a few MiB at T5's 512 tokens). The VAE is loaded for each validation and
///    freed after decoding: kept, Flux's would hold 159.87 MiB (bf16) through every training step
///    of the run; reloaded, it costs 0.25 s per validation, against 2.9 s for a single 256x256
///    decode on the same CPU thread, before any denoising step (bench/validation_vae_cost, median
///    of 5 loads from the page cache). The latents of all pictures are sampled before the VAE loads. Validation runs between optimizer
///    steps and the step's peak is reset when a step begins, so its activations are never in a
///    training step's peak; its own peak is measured and reported separately.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "remat/export.h"
#include "remat/train/options/config.h"

namespace remat::train {

class Transformer;
class ExponentialMovingAverage;
class MultiDataset;

/// One prompt to render, with the name its files and gallery column carry.
struct ValidationPrompt {
  std::string shortname;  ///< "validation", "unconditional", or a prompt library key
  std::string prompt;
};

/// One validation resolution.
struct ValidationResolution {
  int64_t requested_width = 0;   ///< as written: the file name's WxH (SimpleTuner's naming)
  int64_t requested_height = 0;
  int64_t width = 0;             ///< rounded to a multiple of 16: what is rendered
  int64_t height = 0;
  std::string label() const;     ///< "WxH" as written
};

/// The largest rendered side accepted (pixels).
inline constexpr int64_t kMaxValidationSide = 16384;

/// SimpleTuner's MultiaspectImage._round_to_nearest_multiple(pixels, 16): round(pixels / 16) * 16
/// with Python's round (halves to even), and at least 16.
REMAT_API int64_t round_validation_side(int64_t pixels);

/// validation_resolution: "N" (N x N), "WxH" (either x case), several separated by commas with
/// optional spaces. Throws ValidationError naming validation_resolution for anything else, or a
/// side that rounds above kMaxValidationSide.
REMAT_API std::vector<ValidationResolution> parse_validation_resolutions(const std::string& text);

/// SimpleTuner's user_prompt_library file (remat/util/bounded_json.h limits): a JSON object of
/// shortname -> prompt text, or -> an object with "prompt" (else "caption", else "tags"); keys
/// blank after trimming are skipped, as SimpleTuner does. In file order. Throws ValidationError
/// naming user_prompt_library, the file and the key at fault.
REMAT_API std::vector<ValidationPrompt> read_user_prompt_library(const std::string& path);

/// The prompts of a run in SimpleTuner's order: "unconditional" ("") unless
/// validation_disable_unconditional, the library's entries, then validation_prompt as
/// "validation". Empty when !config.validation_requested(). A shortname that is not safe in a
/// file name (empty, "/", "\\", a leading ".", a control character, over 100 bytes) or given twice
/// is a ValidationError.
REMAT_API std::vector<ValidationPrompt> validation_prompts(const TrainConfig& config);

/// One FLUX.1 Kontext validation edit: an edit picture's caption rendered with its reference
/// picture as training sees it.
struct ValidationEdit {
  ValidationPrompt prompt;              ///< shortname "<dataset id>_<n>", the edit caption
  std::string text_path;                ///< the caption's cached embeddings
  std::string reference_latents_path;   ///< the reference picture's cached latents (C, h, w)
};

/// FLUX.1 Kontext's validation edits, collected as SimpleTuner's retrieve_validation_edit_images
/// (simpletuner/helpers/training/validation.py) does: per image dataset with reference pictures
/// (only eval_dataset_id's, when set), its first num_eval_images pairs in dataset order (sorted by
/// relative path), shortname "<dataset id>_<n>". The caption is read from its cache entry's
/// metadata. Empty for runs without pairs. SimpleTuner hands the reference picture to
/// FluxKontextPipeline, which resizes it to about a megapixel; remat conditions on the reference's
/// cached latents, the crop training sees (`remat sample --image` does what the pipeline does).
REMAT_API std::vector<ValidationEdit> validation_edits(const TrainConfig& config, const MultiDataset& data);

/// Whether validation runs after optimizer step `step` (>= 1): SimpleTuner's trigger, step a
/// multiple of validation_interval() > 0. (Steps are optimizer steps, so the accumulation boundary
/// holds; a resumed run starts after its resumed step, so that step is not rendered again.)
REMAT_API bool validation_due(const TrainConfig& config, int64_t step);

/// "step_{step}_{shortname}_{index}_{W}x{H}.png", index counting the pictures of one shortname
/// across the resolutions (SimpleTuner's validation_images.save_images); a picture rendered with
/// the EMA weights ends "_ema.png" (SimpleTuner stitches it beside the other instead).
REMAT_API std::string validation_image_file_name(int64_t step, const std::string& shortname, int64_t index,
                                                 const ValidationResolution& resolution, bool ema = false);

/// Checks before any model loads that `config` can render validation images: a model family that
/// samples (ModelFamily::samples), and pretrained_model_name_or_path a diffusers pipeline folder
/// with the family's encoders (the VAE that made the latents training sees). Throws ValidationError naming the
/// option and how to turn validation off. Returns the pipeline folder.
REMAT_API std::string validation_pipeline_folder(const TrainConfig& config);

/// index.html of `dir` (output_dir/validation_images): a static page (no script, nothing
/// fetched) with a table of one row per step (ascending, step 0 first) and one column per
/// shortname / picture index / resolution (an EMA column right after its trained-weights one), built from the step_*.png files in `dir` (so a resumed
/// run's gallery keeps the earlier steps). `prompts` gives the column order and captions (other
/// shortnames found follow, sorted). Written atomically.
REMAT_API void write_validation_gallery(const std::string& dir, const std::vector<ValidationPrompt>& prompts);

/// What one validation cost.
struct ValidationRun {
  int64_t step = 0;
  int64_t images = 0;
  double seconds = 0;
  double vae_load_seconds = 0;
  int64_t peak_bytes = 0;      ///< peak tracked bytes on the run's device during validation
  int64_t baseline_bytes = 0;  ///< bytes live when validation began (weights, optimizer state ...)
  std::vector<std::string> files;
};

/// Renders a run's validation images. Construct it before training starts (after the transformer
/// is built: the prompts are encoded then and the text encoders freed).
class REMAT_API ValidationRenderer {
 public:
  using LogFn = std::function<void(const std::string&)>;
  /// Checks the setup (validation_pipeline_folder), reads the prompt library, parses the
  /// resolutions and encodes every prompt (and the negative prompt when validation_guidance_real
  /// > 1) on the CPU in the caching phase's dtype (bf16 with mixed_precision bf16, else fp32).
  /// `edits` (a Kontext run's validation_edits) are rendered after the prompts, each with its
  /// reference latents appended (their cached embeddings and latents are read, not encoded).
  ValidationRenderer(const TrainConfig& config, LogFn log, std::vector<ValidationEdit> edits = {});
  ~ValidationRenderer();
  ValidationRenderer(const ValidationRenderer&) = delete;
  ValidationRenderer& operator=(const ValidationRenderer&) = delete;

  /// Renders every prompt at every resolution with `transformer` (put in eval mode under no-grad
  /// and autocast as the training step uses it, then back in its previous mode), decodes them on
  /// `device`, writes the PNGs (text chunks as `remat sample` writes them, plus training_step)
  /// and rewrites index.html. Logs one line with the time and peak memory. With `ema` (use_ema),
  /// ema_validation decides the weights: comparison renders every picture with the trained
  /// weights and again, from the same noise, with the average swapped in; ema_only with the
  /// average alone; none with the trained weights alone.
  ValidationRun render(Transformer& transformer, int64_t step, const at::Device& device,
                       ExponentialMovingAverage* ema = nullptr);

  const std::vector<ValidationPrompt>& prompts() const;
  const std::vector<ValidationResolution>& resolutions() const;
  /// Bytes of the prompt embeddings kept for the whole run.
  int64_t held_bytes() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace remat::train
