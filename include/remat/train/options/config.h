#pragma once
/// \file
/// The typed configuration of `remat train`, and how it is read: a SimpleTuner-style config.json
/// (same key names, with or without a leading "--") overridden by command-line flags.
///
/// Every option is defined once, in the registry of remat/train/options/options.h; this header holds the
/// struct the trainer reads and the entry points that fill it. Defaults are the field initialisers
/// below, and the registry's help text and docs read them from here, so they cannot drift.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "remat/activation_offload.h"
#include "remat/byte_size.h"
#include "remat/checkpoint.h"
#include "remat/checkpoint_plan.h"
#include "remat/export.h"

namespace remat::train {

/// Bad configuration: an unknown key, a value of the wrong type or out of range, or a combination
/// the safety check refuses. `what()` has the shape `[train] <option> must be <valid>, got <value>`;
/// the CLI prints it and exits with code 2 before any work starts.
class REMAT_API ValidationError : public c10::ValueError {
 public:
  ValidationError(std::string option, std::string value, const std::string& message);
  /// The message alone (what() is the same: no backtrace is attached).
  const std::string& message() const noexcept { return msg(); }
  /// The option at fault (SimpleTuner key, without "--"); empty when the problem is not one option.
  const std::string& option() const noexcept { return option_; }
  /// The offending value as written by the user.
  const std::string& value() const noexcept { return value_; }

 private:
  std::string option_;
  std::string value_;
};

/// One finding of validation, tied to an option when it is about one.
struct Diagnostic {
  enum class Severity { Error, Warning };
  Severity severity = Severity::Error;
  std::string option;   ///< the option at fault (without "--"); empty when not one option
  std::string value;    ///< the value as written; empty when none
  std::string message;  ///< the whole sentence: "[train] <option> must be <valid>, got '<value>'"
};

/// Every error validation found, at once. what() is their messages, one per line; option() and
/// value() are the first error's. The CLI prints them all and exits with code 2; a UI shows each
/// next to its field.
class REMAT_API ValidationErrors : public ValidationError {
 public:
  explicit ValidationErrors(std::vector<Diagnostic> errors);
  const std::vector<Diagnostic>& errors() const noexcept { return errors_; }

 private:
  std::vector<Diagnostic> errors_;
};

/// The most optimizer steps a run may have: the bound of max_train_steps, of the steps that
/// num_train_epochs works out to, and of a checkpoint's global_step. 10^9 steps is years of
/// training at the fastest step rates; the bound keeps every step and batch count far from int64
/// overflow.
inline constexpr int64_t kMaxTrainSteps = 1'000'000'000;
/// The most CPU threads num_threads may ask for (one thread per core of the largest machines; a
/// request for 100000 threads once hung `remat bench`).
inline constexpr int64_t kMaxNumThreads = 1024;

/// gradient_checkpointing_interval as one value: per block (blank, or 1: SimpleTuner's
/// `checkpoint every block`), contiguous chunks of N > 1 blocks, or `auto` (the budget planner
/// picks the layout, remat/train/memory/auto_layout.h). The options registry (options.cpp) owns its text:
/// parse and blocks() check the value against the registry's row (an integer in
/// [1, models::kMaxConfigBlocks] or auto), so a held value is always valid and nothing else checks
/// it. What a model family can use of it is the plan's business (remat/train/options/safety_check.h).
class REMAT_API CheckpointInterval {
 public:
  /// Per block.
  CheckpointInterval() = default;
  /// The option's text as the registry reads it: "auto", a count ("4", "2.0"), or blank / none
  /// (per block). Throws ValidationError naming the option and its valid values.
  static CheckpointInterval parse(const std::optional<std::string>& text);
  /// Chunks of `n` blocks (1: per block); throws ValidationError as parse does.
  static CheckpointInterval blocks(int64_t n);
  /// The budget planner's choice.
  static CheckpointInterval automatic();

  bool is_auto() const { return blocks_ == kAuto; }
  /// Per block (blank or 1).
  bool per_block() const { return blocks_ == 1; }
  /// Blocks per chunk when fixed chunks longer than one block are asked for; unset per block and
  /// for auto.
  std::optional<int64_t> chunk() const { return blocks_ > 1 ? std::optional<int64_t>(blocks_) : std::nullopt; }
  /// The option's text: unset per block (the default), "auto", or the count.
  std::optional<std::string> text() const;

  bool operator==(const CheckpointInterval& other) const { return blocks_ == other.blocks_; }
  bool operator!=(const CheckpointInterval& other) const { return blocks_ != other.blocks_; }

 private:
  static constexpr int64_t kAuto = 0;
  int64_t blocks_ = 1;  ///< blocks per chunk (>= 1), or kAuto
};

/// Everything `remat train` needs, validated. Field names are SimpleTuner's option names.
/// Choice-valued fields hold one of the registry's choices (see docs/OPTIONS.md).
/// The model_family of a config that names none: the first built-in family (remat/train/family/family.h).
REMAT_API std::string default_model_family();

/// The pretrained_model_name_or_path that asks for random weights whatever the flavour (a local
/// path of that name wins).
inline constexpr const char* kRandomWeights = "random";

struct TrainConfig {
  // ---- model ----
  /// A registered model family (remat/train/family/family.h; model_family_names()).
  std::string model_family = default_model_family();
  /// A flavour of the family (SimpleTuner's names: dev, krea, schnell, ... for Flux; base, turbo,
  /// ... for MageFlow; remat's flux-tiny, mageflow-small ... for tests). Unset on input means the
  /// family's default (krea, base); after load_train_config it always holds a current flavour
  /// name of `model_family` (older names such as flux-dev are mapped).
  std::string model_flavour;
  /// The transformer weights: a .safetensors file, a diffusers Flux pipeline folder (its
  /// transformer/, config.json included) or a transformer folder (config.json + weights, possibly
  /// sharded), or a Hugging Face model id ("org/name") found in the local hub cache
  /// (resolve_hub_models, remat/train/family/hub_models.h). Unset: the flavour's hub id for a
  /// published flavour, random initialisation (a warning) for remat's small ones; "random":
  /// random initialisation whatever the flavour.
  std::optional<std::string> pretrained_model_name_or_path;
  /// The revision of every hub id above: a branch, a tag or a commit hash. Unset: main.
  std::optional<std::string> revision;
  /// SimpleTuner's per-component sources: the transformer from another pipeline or transformer
  /// folder (in `pretrained_transformer_subfolder`, "none" for the path itself; unset: the path
  /// itself when it holds config.json, else its transformer/), and the VAE folder (checked only:
  /// training reads VAE latents from the cache).
  std::optional<std::string> pretrained_transformer_model_name_or_path;
  std::optional<std::string> pretrained_transformer_subfolder;
  std::optional<std::string> pretrained_vae_model_name_or_path;
  /// Optional diffusers-style transformer config.json overriding the flavour's shapes.
  std::optional<std::string> pretrained_transformer_config;
  /// "full" (train every weight) or "lora". SimpleTuner's default, full (CHANGELOG.md).
  std::string model_type = "full";
  /// SimpleTuner's base_model_precision: "no_change" (the training dtype), or a weight-only
  /// quantisation of the frozen base for LoRA (remat/train/memory/base_precision.h: int8-quanto,
  /// nf4-bnb, ...).
  std::string base_model_precision = "no_change";
  int64_t lora_rank = 16;
  /// LoRA scale numerator (scale = alpha / rank). Unset on input means alpha = rank; after
  /// load_train_config it always holds a value.
  std::optional<double> lora_alpha;
  /// Which Flux modules get LoRA adapters (SimpleTuner's Flux.get_lora_target_layers in
  /// simpletuner/helpers/models/flux/model.py): default, all, context, context+ffs,
  /// all+ffs, all+ffs+embedder, ai-toolkit, tiny, nano.
  std::string flux_lora_target = "all";

  // ---- optimizer and schedule ----
  double learning_rate = 4e-7;
  /// "adamw_bf16", "torch-adamw" or "optimi-lion" (remat/train/optimizers/optimizer.h); "lion" is read as
  /// optimi-lion. SimpleTuner's default, adamw_bf16.
  std::string optimizer = "adamw_bf16";
  /// SimpleTuner's comma-separated optimizer overrides, "weight_decay=0.0,eps=1e-8"; empty: none.
  std::string optimizer_config;
  /// Override the optimizer's betas (SimpleTuner applies them only when both are set).
  std::optional<double> optimizer_beta1;
  std::optional<double> optimizer_beta2;
  /// SimpleTuner's deepspeed_config: "zero1", or JSON text or the path of a JSON file whose
  /// zero_optimization.stage is 1 (remat/train/optimizers/zero_optimizer.h); unset: no sharding.
  std::optional<std::string> deepspeed_config;
  /// The ZeRO stage deepspeed_config asks for, set by validation: 0 (none) or 1 (each process
  /// keeps the optimizer state of its shard of the weights).
  int zero_stage = 0;
  /// One of the schedules of remat/train/optimizers/lr_schedule.h (SimpleTuner's names).
  std::string lr_scheduler = "constant_with_warmup";
  int64_t lr_warmup_steps = 0;
  /// The floor of the cosine and sine schedules, and the end of the polynomial one.
  double lr_end = 4e-7;
  /// The exponent of the polynomial schedule.
  double lr_power = 0.8;
  /// Gradient clipping threshold; 0 disables clipping.
  double max_grad_norm = 2.0;
  /// "value" (clamp each gradient element to +-max_grad_norm, SimpleTuner's default) or "norm"
  /// (scale all gradients so their global L2 norm is at most max_grad_norm).
  std::string grad_clip_method = "value";

  // ---- training loop ----
  int64_t train_batch_size = 4;
  int64_t gradient_accumulation_steps = 1;
  /// Optimizer steps to run; 0 means run num_train_epochs epochs instead.
  int64_t max_train_steps = 0;
  /// Passes over the data when max_train_steps is 0; 0 means "use max_train_steps" (one of the
  /// two must be > 0).
  int64_t num_train_epochs = 1;
  /// Unset: a random seed.
  std::optional<int64_t> seed;
  /// "no" (fp32) or "bf16" (autocast to bfloat16).
  std::string mixed_precision = "bf16";
  /// Flow-matching shift applied to sampled sigmas; 0 disables the shift.
  double flow_schedule_shift = 3.0;
  /// Scale of the normal sample before the sigmoid (logit-normal sigma sampling).
  double flow_sigmoid_scale = 1.0;
  /// Sample sigmas uniformly in [0, 1) instead of logit-normal.
  bool flow_use_uniform_schedule = false;
  /// Guidance input of guidance-distilled Flux models (dev, krea) during training.
  double flux_guidance_value = 1.0;

  // ---- gradient checkpointing ----
  bool gradient_checkpointing = true;
  /// Blocks per checkpointed chunk (default: per block), or auto: the budget planner picks the
  /// layout.
  CheckpointInterval gradient_checkpointing_interval;
  /// A chunk starts every `stride` blocks (stride >= interval); unset means stride = interval.
  std::optional<int64_t> gradient_checkpointing_segment_stride;
  /// "torch", "unsloth", "torch-ffn" or "unsloth-ffn" (see checkpoint_backend / checkpoint_ffn_only).
  std::string gradient_checkpointing_backend = "torch";
  /// Memory budget in bytes for the auto planner (remat/train/memory/auto_layout.h): the predicted peak
  /// of a whole training step (parameters, gradients, optimizer state and activations together,
  /// as torch.cuda.max_memory_allocated counts) must fit. Unset: the device's available memory.
  std::optional<int64_t> gradient_checkpointing_memory_budget;
  /// The blocks' attention saves its activations in host memory instead of on the device
  /// (remat/activation_offload.h), checkpointed or not, as SimpleTuner's option.
  bool gradient_checkpointing_offload_attention = false;
  /// Distinct tensor shapes with pooled pinned host buffers for activation offload; 0: pageable
  /// host memory only.
  int64_t gradient_checkpointing_offload_pin_memory_max_buckets = kDefaultOffloadPinMemoryMaxBuckets;
  /// Copy the attention activations of the next block backward runs back ahead of time; only
  /// with gradient_checkpointing_offload_attention.
  bool gradient_checkpointing_offload_prefetch = false;
  /// The attention offload of these options (unset: off).
  std::optional<SavedTensorOffload> attention_offload() const;

  // ---- Block swap (remat/models/block_swap.h) ----
  /// The last N transformer blocks keep their frozen weights in host memory and stream them to
  /// the device for each use (SimpleTuner's musubi_blocks_to_swap); 0: off.
  int64_t musubi_blocks_to_swap = 0;
  /// Where swapped blocks are kept: "cpu" (pinned host memory), the one value remat supports.
  std::string musubi_block_swap_device = "cpu";

  // ---- EMA weights (remat/train/run/ema.h) ----
  /// Keep an exponential moving average of the trained weights, saved beside them.
  bool use_ema = false;
  /// The largest decay of the average (SimpleTuner's default 0.995; at most 0.9999).
  double ema_decay = 0.995;
  /// Update the average after every N-th optimizer step.
  int64_t ema_update_interval = 1;
  /// Where the average lives between updates: "cpu" (host memory) or "accelerator" (the
  /// training device).
  std::string ema_device = "cpu";
  /// Update the average on the host too (implies ema_device cpu).
  bool ema_cpu_only = false;
  /// Update tensor by tensor instead of one fused kernel.
  bool ema_foreach_disable = false;
  /// Copy the weights into the average before this step, then use ema_decay (0: the warm-up
  /// schedule of ema_decay_at).
  int64_t ema_warmup_steps = 0;
  /// Validation images with the average: "none", "ema_only" or "comparison" (both).
  std::string ema_validation = "comparison";

  // ---- data and output ----
  /// A latent-cache directory, or a folder of images with captions (remat/data/image_dataset.h).
  std::optional<std::string> instance_data_dir;
  /// SimpleTuner's multidatabackend.json (remat/data/dataset_config.h); replaces instance_data_dir.
  std::optional<std::string> data_backend_config;
  /// Where image runs cache VAE latents (CACHE_DIR/vae/<family>/<id>) and text embeddings
  /// (CACHE_DIR/text/<family>) unless a backend names its own. Empty: OUTPUT_DIR/cache, as
  /// SimpleTuner's --cache_dir (default None).
  std::string cache_dir;
  /// SimpleTuner's --vae_enable_tiling: the VAE encodes pictures for the latent cache in tiles.
  bool vae_enable_tiling = false;
  // The global defaults of every image backend (SimpleTuner's names and defaults; the enums as
  // their option values: remat/train/options/data_options.h converts).
  double resolution = 1024;
  std::string resolution_type = "pixel_area";
  std::optional<double> minimum_image_size;
  std::optional<double> maximum_image_size;
  std::optional<double> target_downsample_size;
  bool crop = false;
  std::string crop_style = "random";
  std::string crop_aspect = "square";
  std::string caption_strategy = "filename";
  std::optional<std::string> instance_prompt;
  /// SimpleTuner's default (field registry: 0.1; its collate drops each sample's caption with
  /// this chance).
  double caption_dropout_probability = 0.1;
  /// T5's token count for image runs' caption embeddings (captions padded or cut to it): 512 as
  /// FLUX.1-dev's pipeline; schnell uses 256.
  int64_t tokenizer_max_length = 512;
  std::string output_dir = "remat-results";
  /// Save a checkpoint every N optimizer steps; 0 disables periodic checkpoints.
  int64_t checkpoint_step_interval = 500;
  /// Keep at most this many checkpoints (oldest removed first); 0 keeps all.
  int64_t checkpoints_total_limit = 5;
  /// A checkpoint directory, or "latest" (the newest under output_dir, if any). Unset: start fresh.
  std::optional<std::string> resume_from_checkpoint = std::string("latest");

  // ---- validation images (SimpleTuner's options; remat/train/validation/validation_images.h) ----
  /// The prompt rendered every validation_step_interval steps (shortname "validation").
  std::optional<std::string> validation_prompt;
  /// Render validation images every N optimizer steps (0: only the before-training images).
  /// Unset: validation_steps, SimpleTuner's older name, and 100 when that is unset too.
  std::optional<int64_t> validation_step_interval;
  std::optional<int64_t> validation_steps;
  int64_t validation_num_inference_steps = 30;
  /// The embedded guidance of guidance-distilled Flux models (FluxPipeline's guidance_scale).
  double validation_guidance = 7.5;
  /// True classifier-free guidance scale: > 1 also renders validation_negative_prompt per step.
  double validation_guidance_real = 1.0;
  /// Real CFG starts at this denoising step index.
  int64_t validation_no_cfg_until_timestep = 2;
  std::string validation_negative_prompt = "blurry, cropped, ugly";
  /// "1024", "1024x768" or a comma-separated list of them (width x height).
  std::string validation_resolution = "256";
  /// Unset: seed, and 0 when that is unset too (SimpleTuner's `validation_seed or seed or 0`).
  std::optional<int64_t> validation_seed;
  /// Do not render the empty prompt (shortname "unconditional") alongside the prompts.
  bool validation_disable_unconditional = false;
  /// The weights variant every component is read in (SimpleTuner's --variant, diffusers'
  /// `variant=`): `<base>.<variant>.safetensors`; unset: the plain files.
  std::optional<std::string> variant;
  /// SimpleTuner's prompt library: a JSON object {shortname: prompt or {"prompt": ...}}.
  std::optional<std::string> user_prompt_library;
  /// FLUX.1 Kontext: the edits rendered at each validation, per paired image dataset (SimpleTuner's
  /// num_eval_images; at most 1000).
  int64_t num_eval_images = 4;
  /// FLUX.1 Kontext: the image dataset whose pairs validation renders (SimpleTuner's
  /// eval_dataset_id); unset: every paired image dataset.
  std::optional<std::string> eval_dataset_id;
  /// Render the validation images of the untrained model before the first step of a fresh run
  /// (the gallery's step 0). remat's default is true; SimpleTuner's is false.
  bool validation_on_startup = true;
  bool validation_disable = false;
  /// The file format of the LoRA written at the end: "diffusers" (PEFT keys) or "kohya".
  std::string lora_format = "diffusers";

  // ---- runtime ----
  /// "auto", "cpu", "cuda" or "cuda:N" on input; after load_train_config "cpu", "cuda" or
  /// "cuda:N".
  std::string device = "auto";
  /// CPU threads for LibTorch; 0 keeps LibTorch's default (SimpleTuner's default is 8).
  int64_t torch_num_threads = 0;
  /// Log the loss every N optimizer steps.
  int64_t report_every = 10;
  /// Build the model even when its predicted weights, gradients and optimizer state exceed the
  /// device's available memory (remat/train/memory/admission.h).
  bool skip_memory_check = false;
  /// Train even when the config sets SimpleTuner options that change what training computes
  /// and remat does not implement (they are then ignored, with a warning).
  bool ignore_unsupported_options = false;

  /// remat::Backend of gradient_checkpointing_backend: Offload for unsloth*, Recompute otherwise.
  Backend checkpoint_backend() const;
  /// True for the "-ffn" backends: only the feed-forward half of each block is checkpointed.
  bool checkpoint_ffn_only() const;
  /// The checkpoint plan of the gradient_checkpointing* options on model_family, without what the
  /// family cannot use (the safety check's warnings say what is ignored; checkpoint_plan_for in
  /// remat/train/options/safety_check.h). An `auto` interval is the planner's to resolve: this plan is then
  /// per-block. Throws c10::ValueError when invalid (a stride below the interval).
  CheckpointPlan checkpoint_plan() const;
  /// Whether the budget planner picks the layout: checkpointing on, interval auto, and a family
  /// that checkpoints chunks of blocks.
  bool checkpoint_layout_planned() const;
  /// lora_alpha, or lora_rank when unset.
  double lora_alpha_value() const;
  /// validation_step_interval, else validation_steps, else 100 (SimpleTuner's default).
  int64_t validation_interval() const;
  /// Whether the run renders validation images: a validation_prompt or a user_prompt_library is
  /// set and validation_disable is not (remat renders nothing without a prompt; SimpleTuner would
  /// render the unconditional image alone).
  bool validation_requested() const;
  /// The seed of every validation picture: validation_seed or seed or 0, as SimpleTuner's
  /// Python `or` reads it (0 counts as unset).
  uint64_t validation_seed_value() const;
};

/// Option values as text, by option name, before typing: what a config.json or the command line
/// says. std::nullopt means "explicitly unset" (JSON null, an empty value, "None").
using OptionValues = std::map<std::string, std::optional<std::string>>;

/// Reads a SimpleTuner-style config file, its format chosen by the extension:
///  - .json: a flat JSON object;
///  - .toml: a TOML document (top-level keys; SimpleTuner's config.toml);
///  - .env:  SimpleTuner's config.env, `export NAME=value` lines with its environment names
///           (TRAINING_SEED, MODEL_TYPE, ...; remat/train/options/simpletuner.h) and TRAINER_EXTRA_ARGS
///           holding flags.
/// Keys may start with "--"; remat's aliases are mapped to their option name; every other key is
/// returned as written (validation classifies it: a SimpleTuner option remat does not implement,
/// or unknown). Booleans and numbers become their text; null means "the default"; a nested value
/// (a table, an array) becomes its JSON text (only SimpleTuner options remat ignores take one).
/// Notes for the run (config.env names that set no option) are appended to `notes` when given.
/// Throws ValidationError for a missing, malformed or unsupported file, a key given twice, or a
/// nested value of one of remat's options.
REMAT_API OptionValues read_config_file(const std::string& path, std::vector<Diagnostic>* notes = nullptr);

/// The result of parsing a command line: the --config path if given, and the flag values.
struct CommandLine {
  std::optional<std::string> config_path;
  /// Every flag, remat's options under their canonical name, other flags as written (validation
  /// classifies them).
  OptionValues values;
  /// `--help` or `-h` was given: the caller prints train_help_text() instead of training.
  bool help = false;
};

/// Parses `--key=value`, `--key value` and, for booleans, `--flag` (true) / `--flag=false`.
/// `--config path` names the config file. A flag that is not one of remat's options takes the
/// next argument as its value when that is not a flag (else it is "true"). Throws
/// ValidationError for a missing value or a stray positional argument.
REMAT_API CommandLine parse_command_line(const std::vector<std::string>& args);

/// What the environment provides to validation (injectable so tests do not depend on the machine).
struct Environment {
  /// Whether CUDA is usable: resolves device "auto". Default: torch::cuda::is_available().
  bool cuda_available;
  /// CUDA devices (cuda:N needs N < this). Default: torch::cuda::device_count().
  int64_t cuda_devices = 0;
  Environment();
  explicit Environment(bool cuda) : cuda_available(cuda), cuda_devices(cuda ? 1 : 0) {}
};

/// The outcome of validating option values: the config (meaningful when no errors) and every
/// error and warning found, each naming its option.
struct ValidationReport {
  TrainConfig config;
  std::vector<Diagnostic> diagnostics;
  bool ok() const;
  std::vector<Diagnostic> errors() const;
  /// The warnings' messages, in order.
  std::vector<std::string> warnings() const;
};

/// Validates option values against the registry and every rule, collecting all problems rather
/// than stopping at the first: every key classified (remat's option; a SimpleTuner option remat
/// does not implement, listed in one grouped warning or, when it changes what training computes,
/// an error unless ignore_unsupported_options; unknown to both, one error listing them all with
/// close suggestions), types, ranges, choices (per family where they
/// depend on model_family), patterns, relations (stride >= interval), dependencies (an option set
/// while the option it depends on says it has no effect: a warning), deprecations, the family's
/// own rules and, when `safety` is true, the checkpointing safety check. Never throws for bad
/// values.
REMAT_API ValidationReport validate_option_values(const OptionValues& values,
                                                  const Environment& env = Environment(),
                                                  bool safety = true);

/// Builds a TrainConfig from option values (defaults for absent keys), validating each value
/// against the registry (type, range, choices), then cross-option rules (flavour belongs to the
/// family) and resolutions (device auto, lora_alpha, flavour default). Does not run the
/// checkpointing safety check. Appends warnings to `warnings`. Throws ValidationErrors with every
/// error.
REMAT_API TrainConfig build_train_config(const OptionValues& values,
                                         std::vector<std::string>& warnings,
                                         const Environment& env = Environment());

/// The whole pipeline of `remat train`: parse the command line, read --config if given, let the
/// flags override the file, build the TrainConfig and run safety_check. Throws ValidationErrors
/// with every error found (unknown flags and keys included); appends warnings (which the caller
/// logs) to `warnings`. `--help` is ignored here: check
/// parse_command_line(args).help first.
REMAT_API TrainConfig load_train_config(const std::vector<std::string>& args,
                                        std::vector<std::string>& warnings,
                                        const Environment& env = Environment());

/// Parses a byte size as remat::parse_byte_size does; throws ValidationError naming `option`.
REMAT_API int64_t parse_bytes(const std::string& text,
                              const std::string& option = "gradient_checkpointing_memory_budget");

/// remat::format_byte_size: "20GiB", "512MiB", or plain bytes.
using remat::format_byte_size;

}  // namespace remat::train
