// The options registry: the one table of `remat train` options, and the typing and validation of
// values against it. Help text, JSON export and docs are generated from it in options_docs.cpp.
//
// Defaults are not written here: each option binds a TrainConfig field, and its default is read
// from a default-constructed TrainConfig, so the struct's initialisers are the only source.
// Names, defaults, help lines and tooltips follow SimpleTuner's field registry
// (simpletuner_sdk/server/services/field_registry/sections/*.py) unless a comment says otherwise.
#include "string_helpers.h"
#include "remat/train/options/options.h"

#include "options/option_builder.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <regex>

#include "remat/checkpoint_plan.h"
#include "remat/models/config_limits.h"
#include "remat/train/memory/base_precision.h"
#include "remat/train/family/family.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/optimizers/lr_schedule.h"
#include "remat/train/options/simpletuner.h"

namespace remat::train {
namespace {

using remat::detail::join;
using remat::detail::lower;

// Upper bounds of the integer options (every one has one: values come from files and flags, and
// an unbounded count overflowed or hung; Note [Option bounds]). kMaxTrainSteps and
// kMaxNumThreads are in remat/train/options/config.h, where the trainer and the benchmark use them too.
// Note [Option bounds]
// Each bound is far above any real run and low enough that no product the trainer forms from
// option values (epochs x batches, batch x accumulation, steps x accumulation) can overflow int64.
constexpr double kMaxLoraRank = 4096;          // the widest published transformers have width 3072-4096
constexpr double kMaxBatch = 65536;            // samples per micro-batch, micro-batches per step
constexpr double kMaxEpochs = 1'000'000;
constexpr double kMaxSeed = 4294967295.0;      // 2^32 - 1
constexpr double kMaxBlocks = models::kMaxConfigBlocks;  // blocks per stack
constexpr double kMaxCheckpointsKept = 1'000'000;


using T = OptionType;
using C = TrainConfig;

const char* const kModel = "Model";
const char* const kLora = "LoRA";
const char* const kOptim = "Optimizer and learning rate";
const char* const kTraining = "Training";
const char* const kFlow = "Flow matching";
const char* const kEma = "EMA weights";
const char* const kCkpt = "Gradient checkpointing";
const char* const kOffload = "Memory offload";
const char* const kData = "Data and output";
const char* const kValidation = "Validation images";
const char* const kRuntime = "Runtime";


std::vector<OptionSpec> build_registry() {
  std::vector<OptionSpec> r;
  const auto add = [&r](Opt o) { r.push_back(o.done()); };
  // clang-format off
  // ---- Model ----
  // The families' names, flavours and defaults come from the family registry.
  std::vector<std::string> family_names, all_flavours, default_flavours;
  std::map<std::string, std::vector<std::string>> flavours_by_family;
  std::map<std::string, std::string> flavour_labels, flavour_aliases, flavour_unsupported;
  std::vector<std::string> family_titles;
  for (const ModelFamily* f : model_families()) {
    family_names.push_back(f->name);
    family_titles.push_back(f->display_name.empty() ? f->name : f->display_name);
    for (const auto& flavour : f->flavour_specs) {
      if (std::find(all_flavours.begin(), all_flavours.end(), flavour.name) == all_flavours.end()) {
        all_flavours.push_back(flavour.name);
      }
      flavour_labels[flavour.name] =
          flavour.hub_id.empty() ? flavour.summary : flavour.summary + " (Hugging Face id " + flavour.hub_id + ")";
      if (!flavour.unsupported.empty()) flavour_unsupported[flavour.name] = flavour.unsupported;
    }
    for (const auto& [old, current] : f->flavour_aliases) flavour_aliases[old] = current;
    default_flavours.push_back(f->name + ": " + f->default_flavour);
    flavours_by_family[f->name] = f->flavours;
  }
  add(Opt(kModel, "model_family", T::Choice, bind_field(&C::model_family),
          "The architecture to train: " + join(family_titles, " or "))
      .choices(family_names));
  Opt flavour(kModel, "model_flavour", T::Choice, bind_field(&C::model_flavour),
              "Which published model of the family (SimpleTuner's flavour names), or a small test "
              "configuration");
  flavour.choices(all_flavours)
      .choices_by("model_family", flavours_by_family)
      .labels(flavour_labels)
      .nullable()
      .tooltip("Must belong to model_family. The flavour fixes the architecture (and, for some, "
               "settings SimpleTuner applies with it); the weights come from "
               "pretrained_model_name_or_path. flux-tiny, flux-small, mageflow-tiny and "
               "mageflow-small are remat's small configurations for tests and benchmarks.")
      .default_note("unset (the family's default: " + join(default_flavours, ", ") + ")");
  for (const auto& [old, current] : flavour_aliases) flavour.value_alias(old, current);
  for (const auto& [name, needs] : flavour_unsupported) flavour.unsupported(name, needs);
  add(std::move(flavour));
  add(Opt(kModel, "pretrained_model_name_or_path", T::Path, bind_field(&C::pretrained_model_name_or_path),
          "The model: a diffusers pipeline folder, a transformer folder, a .safetensors file with "
          "diffusers key names, or a Hugging Face model id in the local hub cache")
      .nullable()
      .tooltip("A pipeline folder (model_index.json) gives its transformer/ with its config.json; a "
               "transformer folder holds config.json and diffusion_pytorch_model.safetensors or a "
               "sharded index; a single .safetensors uses the flavour's shapes. An id such as "
               "black-forest-labs/FLUX.1-dev that is not a local path is read from the Hugging Face "
               "cache (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub) at `revision`; "
               "remat never downloads. Unset: the flavour's hub id, as SimpleTuner maps it "
               "(remat's small flavours start from random weights); random: random weights. "
               "See docs/PIPELINE_FOLDER.md.")
      .default_note("unset (the flavour's hub id; random weights for remat's small flavours)"));
  add(Opt(kModel, "revision", T::String, bind_field(&C::revision),
          "The revision of a Hugging Face model id: a branch, a tag or a commit hash")
      .nullable()
      .tooltip("Applies to every model option given as a hub id (pretrained_model_name_or_path, "
               "pretrained_transformer_model_name_or_path, pretrained_vae_model_name_or_path) and to "
               "the flavour's default id. The revision must be in the local cache.")
      .default_note("unset (main)"));
  add(Opt(kModel, "variant", T::String, bind_field(&C::variant),
          "The weights variant to read: <name>.<variant>.safetensors (fp16, bf16, non_ema ...)")
      .nullable()
      .pattern("^[A-Za-z0-9_-]{1,64}$", "a variant name: 1 to 64 letters, digits, '_' or '-'")
      .tooltip("As diffusers' variant= and SimpleTuner's --variant: every component (transformer, VAE, "
               "text encoders) is read from its variant files, diffusion_pytorch_model.fp16.safetensors or "
               "the shard index diffusion_pytorch_model.safetensors.index.fp16.json (model.* for "
               "transformers' components). A component without them is an error naming what is there.")
      .default_note("unset (the plain files)"));
  add(Opt(kModel, "pretrained_transformer_model_name_or_path", T::Path,
          bind_field(&C::pretrained_transformer_model_name_or_path),
          "Take the transformer from this pipeline or transformer folder instead")
      .nullable()
      .tooltip("With pretrained_transformer_subfolder naming its subfolder. Unset: the transformer "
               "comes from pretrained_model_name_or_path."));
  add(Opt(kModel, "pretrained_transformer_subfolder", T::String, bind_field(&C::pretrained_transformer_subfolder),
          "The subfolder of pretrained_transformer_model_name_or_path holding the transformer")
      .nullable()
      .tooltip("none: the path itself. Unset: the path itself when it holds a config.json, "
               "otherwise its transformer/ (SimpleTuner's default, transformer).")
      .default_note("unset (the path itself if it has config.json, else transformer)"));
  add(Opt(kModel, "pretrained_vae_model_name_or_path", T::Path, bind_field(&C::pretrained_vae_model_name_or_path),
          "Take the VAE from this pipeline or VAE folder instead")
      .nullable()
      .tooltip("A local folder, or a Hugging Face model id found in the local hub cache, is checked "
               "at start (config.json and weights); an id not in the cache is noted and not read. "
               "Training reads VAE latents from the latent cache, so the VAE is not loaded."));
  add(Opt(kModel, "pretrained_transformer_config", T::Path, bind_field(&C::pretrained_transformer_config),
          "A transformer config.json (diffusers format) overriding the flavour's shapes")
      .nullable());
  add(Opt(kModel, "model_type", T::Choice, bind_field(&C::model_type),
          "Train every weight (full) or low-rank adapters (lora)")
      .choices({"full", "lora"})
      .labels({{"full", "Full fine-tune (every weight)"}, {"lora", "LoRA adapters"}})
      .tooltip("SimpleTuner's default, full, is remat's too (it used to be lora; see CHANGELOG.md)."));
  // SimpleTuner's whole vocabulary is valid (its configs load); the names remat does not
  // implement are refused by name (remat/train/memory/base_precision.h). Its registry shows the option
  // for model_type lora only ("enable"); remat refuses it with a full fine-tune.
  Opt precision(kModel, "base_model_precision", T::Choice, bind_field(&C::base_model_precision),
                "Precision for loading the base model. Lower precision saves memory.");
  precision.choices(simpletuner_base_model_precisions())
      .labels(base_model_precision_labels())
      .unavailable(base_model_precision_unavailable)
      .depends("model_type", "lora", "enable")
      .tooltip("Weight-only quantisation of the frozen transformer for LoRA training: the attention, "
               "feed-forward and modulation Linears of the blocks are stored as int8 with one scale "
               "per output channel (int8-quanto, int8-torchao), 4-bit NormalFloat with an absmax "
               "per 64 weights and double-quantised scales (nf4-bnb), or float8 e4m3 (fp8-quanto, "
               "fp8wo-torchao; LibTorch 2.1+). Each layer dequantises its weight for its own "
               "matmul only. Embedders, norms, the output projection and the LoRA factors stay in "
               "the training dtype. Memory admission, interval auto and remat bench count the "
               "quantised size. docs/QUANTISATION.md has what each costs and saves.");
  for (const auto& [name, needs] : unsupported_base_model_precisions()) precision.unsupported(name, needs);
  add(std::move(precision));
  // ---- LoRA ----
  add(Opt(kLora, "lora_rank", T::Int, bind_field(&C::lora_rank), "Dimension of LoRA update matrices")
      .min(1).max(kMaxLoraRank).depends("model_type", "lora"));
  add(Opt(kLora, "lora_alpha", T::Float, bind_field(&C::lora_alpha),
          "Scales the LoRA effect: scale = lora_alpha / lora_rank (usually equal to rank)")
      .min(0, true).nullable().depends("model_type", "lora").default_note("unset (= lora_rank)"));
  // SimpleTuner's choices are diffusers and comfyui; kohya is remat's (issue 13): the layout of
  // kohya's sd-scripts, which the tools that read only that need.
  add(Opt(kLora, "lora_format", T::Choice, bind_field(&C::lora_format),
          "The key layout of the LoRA file written at the end of training")
      .choices({"diffusers", "kohya", "comfyui"})
      .labels({{"diffusers", "Diffusers / PEFT (transformer.<module>.lora_A.weight)"},
               {"kohya", "kohya sd-scripts (lora_unet_<Black Forest Labs name>.lora_down.weight with .alpha)"},
               {"comfyui", "ComfyUI (diffusion_model.*), not written by remat yet"}})
      .value_alias("peft", "diffusers")
      .unsupported("comfyui", "a writer of ComfyUI's diffusion_model.* LoRA keys")
      .depends("model_type", "lora")
      .tooltip("The file is output_dir/pytorch_lora_weights.safetensors in either layout (kohya "
               "replaces the diffusers layout, as SimpleTuner's comfyui does; training checkpoints "
               "are unchanged). kohya writes the q, k, v adapters of a fused Black Forest Labs "
               "layer as one block-diagonal adapter with rank and alpha multiplied by their "
               "count, so every reader gets the same weight deltas. remat sample reads both."));
  // ---- Optimizer and learning rate ----
  add(Opt(kOptim, "learning_rate", T::Float, bind_field(&C::learning_rate), "Base learning rate for training")
      .min(0).max(1)
      .tooltip("Controls how much model weights change per step. Lower = more stable but slower. "
               "Typical range: 1e-6 to 1e-4"));
  add(Opt(kOptim, "optimizer", T::Choice, bind_field(&C::optimizer),
          "The optimizer (SimpleTuner's names; remat implements these three)")
      .choices(optimizer_names())
      .labels({{"adamw_bf16", "AdamW on bf16 weights with stochastic rounding (SimpleTuner's AdamWBF16)"},
               {"torch-adamw", "AdamW (PyTorch's, fp32 state)"},
               {"optimi-lion", "Lion (optimi's, sign of the momentum)"}})
      .value_alias("lion", "optimi-lion")
      .value_alias("adamw", "torch-adamw")
      .tooltip("Each starts from its SimpleTuner defaults: adamw_bf16 betas (0.9, 0.999), eps 1e-6, "
               "weight decay 0.01; torch-adamw (0.9, 0.999), 1e-8, 0.01; optimi-lion (0.9, 0.99), "
               "weight decay 0. Change them with optimizer_config and optimizer_beta1/2 (SimpleTuner "
               "uses adam_* only with DeepSpeed). Other SimpleTuner optimizers are an error naming "
               "these."));
  add(Opt(kOptim, "optimizer_config", T::String, bind_field(&C::optimizer_config),
          "Optimizer settings to override, comma-separated: weight_decay=0.0,eps=1e-8")
      .nullable()
      .pattern("[A-Za-z_][A-Za-z0-9_]*=[^,=]*(,[A-Za-z_][A-Za-z0-9_]*=[^,=]*)*",
               "comma-separated key=value pairs")
      .tooltip("Keys each optimizer takes: adamw_bf16 and torch-adamw: weight_decay, eps (torch-adamw "
               "also amsgrad); optimi-lion: weight_decay, decouple_lr, max_lr. Keys an optimizer "
               "does not take are dropped with a warning, as SimpleTuner does."));
  add(Opt(kOptim, "optimizer_beta1", T::Float, bind_field(&C::optimizer_beta1),
          "First moment decay rate for optimizers (used when optimizer_beta2 is set too)")
      .min(0).max(1).nullable());
  add(Opt(kOptim, "optimizer_beta2", T::Float, bind_field(&C::optimizer_beta2),
          "Second moment decay rate for optimizers (used when optimizer_beta1 is set too)")
      .min(0).max(1).nullable());
  add(Opt(kOptim, "lr_scheduler", T::Choice, bind_field(&C::lr_scheduler),
          "How learning rate changes during training")
      .choices(lr_scheduler_names())
      .value_alias("cosine_with_warmup", "cosine")
      .labels({{"constant", "Constant"},
               {"constant_with_warmup", "Linear warmup, then constant"},
               {"linear", "Linear warmup, then linear decay to 0"},
               {"polynomial", "Linear warmup, then polynomial decay to lr_end"},
               {"cosine", "Raised cosine with half-period lr_warmup_steps, down to lr_end"},
               {"sine", "Sine wave with half-period lr_warmup_steps, between lr_end and the rate"},
               {"cosine_with_restarts", "SimpleTuner's restarts schedule (stays at the rate)"}})
      .tooltip("As SimpleTuner computes them (remat/train/optimizers/lr_schedule.h has each formula): constant "
               "with lr_warmup_steps > 0 becomes constant_with_warmup; cosine, sine and "
               "cosine_with_restarts use lr_warmup_steps as their period, not as a warmup; "
               "cosine_with_warmup is read as cosine."));
  add(Opt(kOptim, "lr_warmup_steps", T::Int, bind_field(&C::lr_warmup_steps),
          "Number of steps to gradually increase LR from 0").min(0).max(kMaxTrainSteps));
  add(Opt(kOptim, "lr_end", T::Float, bind_field(&C::lr_end),
          "The lowest learning rate of the polynomial, cosine and sine schedules").min(0));
  add(Opt(kOptim, "lr_power", T::Float, bind_field(&C::lr_power),
          "Power of the polynomial schedule's decay").min(0));
  add(Opt(kOptim, "max_grad_norm", T::Float, bind_field(&C::max_grad_norm),
          "Gradient clipping threshold to prevent exploding gradients (0 disables clipping)").min(0));
  add(Opt(kOptim, "grad_clip_method", T::Choice, bind_field(&C::grad_clip_method),
          "How max_grad_norm clips: each gradient value, or the global norm")
      .choices({"value", "norm"})
      .labels({{"value", "Clip individual values to +-max_grad_norm"}, {"norm", "Clip the global L2 norm"}}));
  // ---- Training ----
  add(Opt(kTraining, "train_batch_size", T::Int, bind_field(&C::train_batch_size),
          "Number of samples processed per forward/backward pass").min(1).max(kMaxBatch));
  add(Opt(kTraining, "gradient_accumulation_steps", T::Int, bind_field(&C::gradient_accumulation_steps),
          "Number of steps to accumulate gradients").min(1).max(kMaxBatch));
  add(Opt(kTraining, "max_train_steps", T::Int, bind_field(&C::max_train_steps),
          "Maximum number of training steps (0 = use epochs instead)").min(0).max(kMaxTrainSteps));
  add(Opt(kTraining, "num_train_epochs", T::Int, bind_field(&C::num_train_epochs),
          "Number of passes over the data (0 = use max_train_steps instead)").min(0).max(kMaxEpochs)
      .tooltip("max_train_steps wins when both are set; one of them must be above 0. The steps it "
               "works out to (epochs x batches per epoch / gradient_accumulation_steps) must be at "
               "most " + std::to_string(kMaxTrainSteps) + "."));
  add(Opt(kTraining, "seed", T::Int, bind_field(&C::seed), "Seed used for deterministic training behaviour")
      // [0, 2^32 - 1]: the seeds numpy accepts, to which SimpleTuner passes its seed.
      .min(0).max(kMaxSeed).nullable().tooltip("Unset: a random seed, logged at start."));
  add(Opt(kTraining, "mixed_precision", T::Choice, bind_field(&C::mixed_precision),
          "Precision for training computations")
      .choices({"no", "bf16"})
      .labels({{"no", "fp32"}, {"bf16", "bfloat16 autocast"}})
      .tooltip("bf16 runs the transformer under bfloat16 autocast with fp32 master weights; no "
               "trains in fp32."));
  // ---- EMA weights ----
  // SimpleTuner's ema_config section (sections/training.py) and ema_validation
  // (sections/logging_fields.py); remat/train/run/ema.h says how remat computes the average.
  // SimpleTuner's configs carry ema_* whatever use_ema says: unused, they are not warned about.
  add(Opt(kEma, "use_ema", T::Bool, bind_field(&C::use_ema),
          "Maintain an exponential moving average copy of the model during training")
      .tooltip("Improves convergence stability at the cost of extra memory and compute: a float32 "
               "copy of the trainable weights (4 bytes per trainable parameter), counted by the "
               "memory check and the checkpoint planner where it lives. Saved in every checkpoint "
               "(transformer_ema/) and at the end beside the trained weights: ema/" +
               std::string("pytorch_lora_weights.safetensors") + " for LoRA, transformer_ema/ for a full fine-tune."));
  add(Opt(kEma, "ema_decay", T::Float, bind_field(&C::ema_decay),
          "Smoothing factor for EMA updates (closer to 0.9999 = slower drift)")
      .min(0).max(0.9999).depends("use_ema", "true").quiet_when_unused()
      .tooltip("The largest decay used: after step t the decay is min(ema_decay, (1 + n) / (10 + n)) "
               "with n = t - 1 (0 at the first step, which copies the weights), as SimpleTuner's "
               "EMAModel.get_decay. Try 0.999 for a responsive average, 0.9999 for extra smoothness."));
  add(Opt(kEma, "ema_update_interval", T::Int, bind_field(&C::ema_update_interval),
          "Update EMA weights every N optimizer steps")
      .min(1).max(kMaxTrainSteps).depends("use_ema", "true").quiet_when_unused()
      .tooltip("Higher values make training faster but the average less smooth; the decay is that "
               "of the step the update follows."));
  add(Opt(kEma, "ema_device", T::Choice, bind_field(&C::ema_device), "Where to keep the EMA weights in-between updates")
      .choices({"accelerator", "cpu"})
      .labels({{"accelerator", "Training Accelerator"}, {"cpu", "CPU"}})
      .depends("use_ema", "true").quiet_when_unused()
      .tooltip("accelerator keeps the average on the training device (its memory counts there); cpu "
               "keeps it in host memory and updates it on the device one tensor at a time."));
  add(Opt(kEma, "ema_cpu_only", T::Bool, bind_field(&C::ema_cpu_only),
          "Keep EMA weights exclusively on CPU even when ema_device would normally move them")
      .depends("use_ema", "true").quiet_when_unused()
      .tooltip("Implies ema_device cpu and updates the average on the host: no device memory, slower "
               "updates."));
  add(Opt(kEma, "ema_foreach_disable", T::Bool, bind_field(&C::ema_foreach_disable),
          "Fallback to standard tensor ops instead of torch.foreach updates")
      .depends("use_ema", "true").quiet_when_unused()
      .tooltip("The fused update and the per-tensor one compute the same values; disable the fused one "
               "if a backend has trouble with foreach kernels."));
  add(Opt(kEma, "ema_warmup_steps", T::Int, bind_field(&C::ema_warmup_steps),
          "Copy current weights into EMA before this optimizer step, then use the configured decay")
      .min(0).max(kMaxTrainSteps).depends("use_ema", "true").quiet_when_unused()
      .tooltip("0 keeps the warm-up schedule of ema_decay."));
  // ---- Flow matching ----
  add(Opt(kFlow, "flow_schedule_shift", T::Float, bind_field(&C::flow_schedule_shift),
          "Shift the noise schedule for flow-matching models")
      .min(0)
      .tooltip("sigma' = shift * sigma / (1 + (shift - 1) * sigma). Higher values train more on "
               "noisy timesteps (composition); 0 disables the shift."));
  add(Opt(kFlow, "flow_sigmoid_scale", T::Float, bind_field(&C::flow_sigmoid_scale),
          "Scale factor for sigmoid timestep sampling for flow-matching models")
      .min(0, true)
      .tooltip("Sigmas are sigmoid(scale * n) with n ~ N(0, 1) (logit-normal) before the shift."));
  add(Opt(kFlow, "flow_use_uniform_schedule", T::Bool, bind_field(&C::flow_use_uniform_schedule),
          "Use uniform schedule instead of sigmoid for flow-matching"));
  // ---- Gradient checkpointing ----
  // Help, tooltips and labels are remat's own words; they cover what SimpleTuner's field registry
  // says of these options (chunk size and spacing, labelled backends, enable/show dependencies).
  add(Opt(kCkpt, "gradient_checkpointing", T::Bool, bind_field(&C::gradient_checkpointing),
          "Save memory by running checkpointed blocks again in the backward pass instead of "
          "keeping their activations")
      .checkpointing()
      .tooltip("A checkpointed block keeps only its inputs during the forward pass; backward runs it "
               "once more to rebuild the rest. Activation memory drops sharply and each step takes "
               "longer (SimpleTuner quotes about 20%)."));
  add(Opt(kCkpt, "gradient_checkpointing_interval", T::Int, bind_interval(),
          "Chunk size: how many consecutive transformer blocks share one checkpoint (blank: "
          "every block is checkpointed on its own)")
      .min(1).max(kMaxBlocks).keywords({"auto"}).nullable().checkpointing()
      .depends("gradient_checkpointing", "true", "enable")
      .tooltip("Flux and MageFlow checkpoint whole blocks in contiguous chunks of N blocks; "
               "gradient_checkpointing_segment_stride sets the spacing between chunks. A larger "
               "chunk stores fewer block inputs but has all of its activations in memory while it is "
               "recomputed. (For some other model families SimpleTuner reads N as \"checkpoint every "
               "N-th block\".) 1 is the same as blank; auto lets the budget planner choose the layout "
               "for gradient_checkpointing_memory_budget."));
  add(Opt(kCkpt, "gradient_checkpointing_segment_stride", T::Int,
          bind_field(&C::gradient_checkpointing_segment_stride),
          "Spacing: a checkpointed chunk starts every N blocks, and the blocks between chunks keep "
          "their activations (blank: N = the interval, chunks back to back)")
      .min(1).max(kMaxBlocks).nullable().checkpointing().depends("gradient_checkpointing", "true", "enable")
      .at_least("gradient_checkpointing_interval")
      .tooltip("Needs an interval and must be at least as large. Interval 2 with stride 4 "
               "checkpoints blocks 0-1, runs 2-3 normally, checkpoints 4-5, and so on; every block "
               "stack (Flux's double and single blocks) starts the pattern again at its first block."));
  add(Opt(kCkpt, "gradient_checkpointing_backend", T::Choice, bind_field(&C::gradient_checkpointing_backend),
          "How checkpointed activations come back during backward, and which part of each block "
          "is checkpointed")
      .choices(CheckpointPlan::backend_names())
      .labels({{"torch", "Recompute whole blocks (PyTorch)"},
               {"unsloth", "Recompute whole blocks, block inputs kept in host memory (Unsloth)"},
               {"torch-ffn", "Recompute only the feed-forward part (PyTorch)"},
               {"unsloth-ffn", "Recompute only the feed-forward part, its inputs kept in host memory (Unsloth)"}})
      .checkpointing().depends("gradient_checkpointing", "true", "show")
      .tooltip("torch recomputes from inputs kept on the device; unsloth also moves those saved "
               "inputs to pinned host memory and back (needs CUDA; on CPU they stay where they are). "
               "The -ffn variants checkpoint only each block's feed-forward half, a cheaper trade "
               "that keeps the attention activations, and do not use chunks."));
  add(Opt(kCkpt, "gradient_checkpointing_memory_budget", T::Bytes,
          bind_field(&C::gradient_checkpointing_memory_budget, /*bytes=*/true),
          "Peak memory budget of a training step (weights, gradients, optimizer state and "
          "activations) for gradient_checkpointing_interval=auto, e.g. 20GiB, 512MiB, 1.5GB")
      .min(1).nullable().checkpointing()
      .depends("gradient_checkpointing", "true", "enable")
      .depends("gradient_checkpointing_interval", "auto", "enable")
      .tooltip("The budget planner chooses, per block, keep / recompute / offload so that the "
               "predicted peak of the whole step fits this budget with the least predicted step "
               "time. Unset: what the device has free. KiB/MiB/GiB are powers of 1024, KB/MB/GB "
               "powers of 1000."));
  // SimpleTuner: documentation/OPTIONS.md and activation_offload_context /
  // _PinnedMemoryPool in simpletuner/helpers/training/offloaded_gradient_checkpointer.py.
  add(Opt(kCkpt, "gradient_checkpointing_offload_attention", T::Bool,
          bind_field(&C::gradient_checkpointing_offload_attention),
          "Keep the activations the attention of every block saves for backward in host memory "
          "instead of on the device")
      .checkpointing()
      .tooltip("Each block's attention (projections, q/k norms, rotation, attention, output "
               "projections) runs in a saved-tensor offload scope: what autograd saves there is "
               "copied to pinned host memory on a side stream and back when backward needs it, "
               "with no recomputation. Works alone or with any gradient_checkpointing_backend: a "
               "kept block (segment stride, the -ffn backends, a planned layout) then holds only "
               "its feed-forward activations; a recomputed block offloads while it is recomputed. "
               "Costs host memory and PCIe copies; on CPU nothing moves for real, the tracked "
               "bytes show what a GPU would hold. Flux and MageFlow."));
  add(Opt(kCkpt, "gradient_checkpointing_offload_pin_memory_max_buckets", T::Int,
          bind_field(&C::gradient_checkpointing_offload_pin_memory_max_buckets),
          "How many distinct tensor shapes get pooled pinned host buffers for activation offload "
          "(0: pageable host memory only)")
      .min(0).max(1024).checkpointing()
      .tooltip("Pinned buffers are reused step after step, one bucket per shape; a shape beyond "
               "the cap (variable resolutions or caption lengths) uses ordinary host memory, "
               "which copies more slowly. Applies to the unsloth backends and to "
               "gradient_checkpointing_offload_attention. Default 12, as SimpleTuner."));
  add(Opt(kCkpt, "gradient_checkpointing_offload_prefetch", T::Bool,
          bind_field(&C::gradient_checkpointing_offload_prefetch),
          "Copy the offloaded attention activations of the block backward runs next back ahead "
          "of time")
      .checkpointing().depends("gradient_checkpointing_offload_attention", "true", "enable")
      .tooltip("Backward runs blocks in reverse order, so the schedule is known: when backward "
               "reaches a block, the block before it starts its copy back on the side stream, "
               "overlapping this block's backward, at the cost of one more block's attention "
               "activations on the device. SimpleTuner learns the order at run time; remat's is "
               "static. Only with gradient_checkpointing_offload_attention."));
  // SimpleTuner's field registry (simpletuner_sdk/server/services/field_registry/sections/
  // training.py) puts these in "memory_optimization"; its MusubiBlockSwapManager.build
  // (helpers/musubi_block_swap.py) swaps the last N of all blocks and clamps N to the blocks less one.
  add(Opt(kOffload, "musubi_blocks_to_swap", T::Int, bind_field(&C::musubi_blocks_to_swap),
          "Keep the weights of the last N transformer blocks in host memory and stream them "
          "to the device for each use (0: off)")
      .min(0).max(kMaxBlocks)
      .tooltip("Block swap, as musubi-tuner and SimpleTuner do it: the weights of the last N blocks "
               "(Flux: double blocks, then single blocks) live in pinned host memory and are copied "
               "on a side stream into a small ring of device buffers ahead of each block's forward "
               "and again ahead of its recomputation in backward. Device memory drops by their size "
               "less the ring (the largest checkpointed chunk of swapped blocks plus one block); "
               "each step copies them twice over PCIe. Swapped blocks are always recomputed in "
               "backward (a block the checkpoint layout keeps becomes a checkpoint of its own). A "
               "LoRA run streams the frozen base; a full fine-tune streams its trained weights both "
               "ways: their gradients go back to host memory, where the optimizer steps them and "
               "keeps their state. N above the number of blocks less one is clamped to it. "
               "`remat plan` chooses N for a memory budget."));
  add(Opt(kOffload, "musubi_block_swap_device", T::Choice, bind_field(&C::musubi_block_swap_device),
          "Where the swapped blocks' weights are kept")
      .choices({"cpu"})
      .labels({{"cpu", "Pinned host memory"}})
      .tooltip("SimpleTuner also takes a device string such as cuda:0; remat keeps swapped weights "
               "in host memory only."));
  // ---- Data and output ----
  add(Opt(kData, "instance_data_dir", T::Path, bind_field(&C::instance_data_dir),
          "Directory with the training data: a folder of images with captions, or a latent cache "
          "(one .safetensors per sample)")
      .nullable()
      .tooltip("A folder of PNG, JPEG or WebP images (searched recursively) is one dataset with the "
               "global data options below: its VAE latents and text embeddings are cached in "
               "cache_dir before training. A folder of .safetensors samples is used as it is "
               "(`remat make-demo-data --output DIR` writes one). data_backend_config describes "
               "several datasets instead. remat's own: SimpleTuner names folders only in "
               "data_backend_config."));
  // ---- image datasets: SimpleTuner's global data options (field registry sections data.py and
  // advanced.py; https://github.com/bghira/SimpleTuner/blob/main/documentation/OPTIONS.md,
  // https://github.com/bghira/SimpleTuner/blob/main/documentation/DATALOADER.md). Each is the
  // default of every dataset of data_backend_config that does not set the key itself. ----
  add(Opt(kData, "data_backend_config", T::Path, bind_field(&C::data_backend_config),
          "Path to your SimpleTuner dataset configuration (multidatabackend.json)")
      .nullable()
      .tooltip("A JSON list of datasets: local image folders (\"type\": \"local\") with their captions, "
               "buckets and caches, and \"dataset_type\": \"text_embeds\" caches. Used instead of an "
               "instance_data_dir of images; an instance_data_dir that is a latent cache wins (its "
               "samples are already encoded, and the run says the file is not read). Keys remat does "
               "not implement are listed in one warning; backend types other than local (aws, csv, "
               "huggingface, ...) and values remat does not support "
               "are errors before any model loads. See docs/YOUR_DATA.md and SimpleTuner's "
               "documentation/DATALOADER.md (https://github.com/bghira/SimpleTuner/blob/main/documentation/"
               "DATALOADER.md)."));
  add(Opt(kData, "cache_dir", T::Path, bind_field(&C::cache_dir),
          "Where VAE latents and text embeddings are cached, unless a dataset names its own "
          "(cache_dir_vae, a text_embeds cache_dir)")
      .nullable()
      .default_note("unset (OUTPUT_DIR/cache)")
      .tooltip("Latents go to CACHE_DIR/vae/MODEL_FAMILY/DATASET_ID and text embeddings to "
               "CACHE_DIR/text/MODEL_FAMILY, SimpleTuner's layout. SimpleTuner's help calls it \"the "
               "directory where the downloaded models and datasets will be stored\"; remat downloads "
               "nothing."));
  add(Opt(kData, "resolution", T::Float, bind_field(&C::resolution), "Resolution for training images")
      .min(0, true)
      .tooltip("Measured as resolution_type says: pixel_area 1024 gives buckets of about 1024x1024 "
               "pixels of area, pixel 1024 a shorter edge of 1024, area 1.0 one megapixel. Bucket sides "
               "are multiples of 16 pixels for Flux. SimpleTuner's web UI asks for 256-4096 in steps "
               "of 64; its command line, like remat, takes any positive value."));
  add(Opt(kData, "resolution_type", T::Choice, bind_field(&C::resolution_type),
          "How to interpret the resolution value")
      .choices({"pixel", "area", "pixel_area"})
      .labels({{"pixel", "Pixel (shortest edge)"}, {"area", "Area (megapixels)"}, {"pixel_area", "Pixel as Area"}})
      .tooltip("Pixel: resize shortest edge. Area: total pixel count. Pixel as Area: converts pixel to "
               "megapixels (area is deprecated in SimpleTuner in favour of pixel_area). "
               "minimum_image_size, maximum_image_size and target_downsample_size use the same unit."));
  add(Opt(kData, "minimum_image_size", T::Float, bind_field(&C::minimum_image_size),
          "The minimum resolution for both sides of input images")
      .min(0).nullable()
      .tooltip("Smaller images are skipped (counted in the start-of-run summary), never upscaled. "
               "In resolution_type's unit: pixel checks both sides, area and pixel_area the area (and, "
               "with a square crop, both sides against the square's edge). Unset: no minimum, so small "
               "images may be upsampled, which SimpleTuner warns harms quality."));
  add(Opt(kData, "maximum_image_size", T::Float, bind_field(&C::maximum_image_size),
          "Images larger than this are downsampled to target_downsample_size before they are cropped "
          "(with crop), so the crop keeps the scene")
      .min(0).nullable()
      .tooltip("When cropping images that are excessively large, the entire scene context may be "
               "lost, eg. the crop might just end up being a portion of the background. This value uses "
               "resolution_type to determine whether it is a pixel edge or megapixel value; it needs "
               "target_downsample_size."));
  add(Opt(kData, "target_downsample_size", T::Float, bind_field(&C::target_downsample_size),
          "When using maximum_image_size, very-large images exceeding that value will be downsampled "
          "to this target size before cropping")
      .min(0).nullable()
      .tooltip("If resolution_type=area and maximum_image_size=4.0, target_downsample_size=2.0 would "
               "result in a 4 megapixel image being resized to 2 megapixel before cropping to 1 "
               "megapixel."));
  // crop, crop_style and crop_aspect are dataset keys in SimpleTuner (no global flag); remat also
  // takes them as options, the defaults of --instance_data_dir and of every dataset.
  add(Opt(kData, "vae_enable_tiling", T::Bool, bind_field(&C::vae_enable_tiling),
          "Encode pictures for the latent cache in overlapping tiles (diffusers' enable_tiling): bounded "
          "memory for large pictures")
      .tooltip("The VAE's activations are those of one tile of vae/config.json's sample_size pixels "
               "instead of the whole picture; the latents differ slightly at the seams (blended), so "
               "the cache is keyed on it. remat caches only what its memory model says fits, and "
               "suggests this option when a picture does not."));
  add(Opt(kData, "crop", T::Bool, bind_field(&C::crop),
          "Crop images to their bucket from a larger resize (crop_style, crop_aspect); without it, "
          "images are resized to cover their bucket and the overhang is cut the same way")
      .tooltip("remat's own option for SimpleTuner's dataset key crop (default false)."));
  add(Opt(kData, "crop_style", T::Choice, bind_field(&C::crop_style),
          "Where the bucket is cut from the resized image")
      .choices({"random", "center", "corner"})
      .value_alias("centre", "center")
      .labels({{"random", "A random offset, fixed per image by the seed"},
               {"center", "The middle"},
               {"corner", "The top-left corner"}})
      .tooltip("remat's own option for SimpleTuner's dataset key crop_style (default random; face "
               "is not supported)."));
  add(Opt(kData, "crop_aspect", T::Choice, bind_field(&C::crop_aspect),
          "The bucket shape when crop is on: square, the image's own aspect, or the closest of the "
          "dataset's crop_aspect_buckets")
      .choices({"square", "preserve", "closest"})
      .tooltip("remat's own option for SimpleTuner's dataset key crop_aspect (default square). "
               "closest needs crop_aspect_buckets, which only a dataset in data_backend_config lists; "
               "random is not supported."));
  add(Opt(kData, "caption_strategy", T::Choice, bind_field(&C::caption_strategy),
          "How to load captions for images")
      .choices({"filename", "textfile", "instanceprompt"})
      .value_alias("instance_prompt", "instanceprompt")
      .labels({{"filename", "Filename"}, {"textfile", "Text Files"}, {"instanceprompt", "Instance Prompt"}})
      .tooltip("Filename: use image name (underscores become spaces). Textfile: IMAGE.txt beside each "
               "image, one caption per line. Instanceprompt: instance_prompt for every image. "
               "SimpleTuner's parquet, huggingface and webshart strategies are not supported."));
  add(Opt(kData, "instance_prompt", T::String, bind_field(&C::instance_prompt),
          "Default caption for datasets using 'instanceprompt' caption strategy without their own prompt")
      .nullable()
      .tooltip("Used when caption_strategy is 'instanceprompt'. Defines the concept being trained; also "
               "what a dataset's prepend_instance_prompt and only_instance_prompt use."));
  add(Opt(kData, "caption_dropout_probability", T::Float, bind_field(&C::caption_dropout_probability),
          "Caption dropout will randomly drop captions based on this probability")
      .min(0).max(1)
      .tooltip("When set to a value of 0.1, it will drop approximately 10 percent of the inputs: each "
               "sample trains with the empty caption's embedding with this chance. SimpleTuner's "
               "default is 0.1 (its help also mentions SDXL's size conditioning, which Flux has not)."));
  add(Opt(kData, "tokenizer_max_length", T::Int, bind_field(&C::tokenizer_max_length),
          "The maximum length of the T5 tokenizer's output: captions are padded or cut to this many tokens")
      .min(1).max(4096)
      .tooltip("The caption embeddings of an image run are cached at this length (prompt_embeds of "
               "tokenizer_max_length x T5 width); a new value re-encodes every caption. FLUX.1-dev uses "
               "512, schnell 256; short captions train faster with fewer (the demo uses 32). MageFlow "
               "encodes each caption unpadded and cuts it to this many tokens; unset, it is 2048 there, "
               "as SimpleTuner sets it."));
  // SimpleTuner's default is "simpletuner-results"; this tool names its own.
  add(Opt(kData, "output_dir", T::Path, bind_field(&C::output_dir),
          "Directory where model checkpoints and logs will be saved"));
  add(Opt(kData, "checkpoint_step_interval", T::Int, bind_field(&C::checkpoint_step_interval),
          "Save a training checkpoint every N steps (0: only at the end)")
      .min(0).max(kMaxTrainSteps).alias("checkpointing_steps")
      .tooltip("SimpleTuner's older name checkpointing_steps is accepted too. SimpleTuner's minimum "
               "is 1; 0 is remat's own: only the checkpoint at the end."));
  add(Opt(kData, "checkpoints_total_limit", T::Int, bind_field(&C::checkpoints_total_limit),
          "Maximum number of checkpoints to keep on disk (0 keeps all)").min(0).max(kMaxCheckpointsKept)
      .alias("save_total_limit"));
  add(Opt(kData, "resume_from_checkpoint", T::Path, bind_field(&C::resume_from_checkpoint),
          "Select checkpoint to resume training from: a checkpoint directory, or latest")
      .keywords({"latest"}).nullable()
      .tooltip("latest resumes from the newest checkpoint in output_dir and starts fresh when there "
               "is none; none starts from scratch. null or blank is the default, latest (SimpleTuner "
               "drops such keys)."));
  // ---- Validation images ----
  // SimpleTuner's names and defaults (field_registry/sections/validation.py, models/field_registry/
  // flux.py); what they mean for remat: remat/train/validation/validation_images.h.
  add(Opt(kValidation, "validation_prompt", T::String, bind_field(&C::validation_prompt),
          "Prompt to use for validation images")
      .nullable()
      .tooltip("Rendered with the shortname validation, together with the empty prompt (unless "
               "validation_disable_unconditional) and user_prompt_library's prompts. Validation "
               "needs a Flux pipeline folder as pretrained_model_name_or_path (its text encoders "
               "and VAE); without a prompt or a library nothing is rendered."));
  add(Opt(kValidation, "validation_step_interval", T::Int, bind_field(&C::validation_step_interval),
          "Run validation every N training steps")
      .min(0).max(kMaxTrainSteps).nullable()
      .default_note("unset (validation_steps, else 100)")
      .tooltip("At every optimizer step that is a multiple of N (after a resume, only steps after "
               "the resumed one). 0: only the images before training (validation_on_startup)."));
  add(Opt(kValidation, "validation_steps", T::Int, bind_field(&C::validation_steps),
          "SimpleTuner's older name of validation_step_interval, used when that is unset")
      .min(0).max(kMaxTrainSteps).nullable()
      .tooltip("SimpleTuner's configs often set both; validation_step_interval wins."));
  add(Opt(kValidation, "validation_on_startup", T::Bool, bind_field(&C::validation_on_startup),
          "Render validation images with the untrained model before the first step (the gallery's step 0)")
      .tooltip("Only on a fresh start: a resumed run does not render its starting step again. "
               "SimpleTuner's default is false; remat's is true, so that every gallery starts with "
               "the model before training."));
  add(Opt(kValidation, "validation_num_inference_steps", T::Int, bind_field(&C::validation_num_inference_steps),
          "Number of diffusion steps for validation renders")
      .min(1).max(1000));
  add(Opt(kValidation, "validation_resolution", T::String, bind_field(&C::validation_resolution),
          "Resolution of validation images: 1024 (square), 1024x768 (width x height), or several "
          "separated by commas")
      .pattern("\\s*[0-9]+([xX][0-9]+)?\\s*(,\\s*[0-9]+([xX][0-9]+)?\\s*)*",
               "N or WxH (pixels), or several separated by commas")
      .tooltip("Each side is rounded to the nearest multiple of 16 (at least 16; halves to even, "
               "as SimpleTuner's Python round does) and must come to at most 16384; file names "
               "keep the size as written."));
  add(Opt(kValidation, "validation_guidance", T::Float, bind_field(&C::validation_guidance),
          "Guidance scale for validation images: the embedded guidance of guidance-distilled Flux "
          "models (dev, krea)")
      .min(0).max(100)
      .tooltip("FluxPipeline's guidance_scale, an input of the transformer; models without "
               "guidance embedding (schnell) ignore it. SimpleTuner's interface suggests 1 to 30."));
  add(Opt(kValidation, "validation_guidance_real", T::Float, bind_field(&C::validation_guidance_real),
          "True classifier-free guidance scale for validation (1: off)")
      .min(0)
      .tooltip("Above 1, each denoising step from validation_no_cfg_until_timestep on also runs the "
               "transformer on validation_negative_prompt and uses negative + scale x (positive - "
               "negative): twice the work per step."));
  add(Opt(kValidation, "validation_no_cfg_until_timestep", T::Int, bind_field(&C::validation_no_cfg_until_timestep),
          "Skip real CFG for the first N denoising steps")
      .min(0).max(1000));
  add(Opt(kValidation, "validation_negative_prompt", T::String, bind_field(&C::validation_negative_prompt),
          "Negative prompt for validation images (used when validation_guidance_real > 1)"));
  add(Opt(kValidation, "validation_seed", T::Int, bind_field(&C::validation_seed),
          "Fixed seed for reproducible validation images")
      .min(0).max(kMaxSeed).nullable()
      .default_note("unset (seed, else 0)")
      .tooltip("Every picture starts from a CPU generator seeded with validation_seed or seed or 0 "
               "(0 counts as unset, as in SimpleTuner), so each step's pictures differ only by "
               "what training changed. The training random stream is not touched."));
  add(Opt(kValidation, "validation_disable_unconditional", T::Bool, bind_field(&C::validation_disable_unconditional),
          "Disable unconditional image generation during validation"));
  add(Opt(kValidation, "num_eval_images", T::Int, bind_field(&C::num_eval_images),
          "FLUX.1 Kontext: picture pairs rendered at each validation, per image dataset")
      .min(1).max(1000)
      .tooltip("A Kontext run renders, besides the prompts, the first N edit pictures of each paired image "
               "dataset: the edit caption with the reference picture as training sees it, in columns named "
               "<dataset id>_<n>."));
  add(Opt(kValidation, "eval_dataset_id", T::String, bind_field(&C::eval_dataset_id),
          "FLUX.1 Kontext: the image dataset whose picture pairs validation renders")
      .nullable()
      .default_note("unset (every paired image dataset)"));
  add(Opt(kValidation, "user_prompt_library", T::Path, bind_field(&C::user_prompt_library),
          "A JSON prompt library: {\"shortname\": \"prompt\"} or {\"shortname\": {\"prompt\": ...}}")
      .nullable()
      .tooltip("SimpleTuner's format: an object of shortname -> prompt text, or -> an object with "
               "prompt (or caption, or tags). Each is rendered under its shortname."));
  add(Opt(kValidation, "ema_validation", T::Choice, bind_field(&C::ema_validation),
          "Control how EMA weights are used during validation runs")
      .choices({"none", "ema_only", "comparison"})
      .labels({{"none", "Disable EMA Validation"}, {"ema_only", "EMA Only"}, {"comparison", "Compare EMA & Base"}})
      .tooltip("With use_ema: comparison renders every picture with the trained weights and again with "
               "the average (files ending _ema.png, a column beside each in the gallery); ema_only "
               "renders only the average; none only the trained weights."));
  add(Opt(kValidation, "validation_disable", T::Bool, bind_field(&C::validation_disable),
          "Completely disable validation image generation"));
  // ---- Runtime ----
  add(Opt(kRuntime, "device", T::String, bind_field(&C::device), "Device to train on: auto, cpu, cuda or cuda:N")
      .pattern("auto|cpu|cuda(:[0-9]+)?", "auto, cpu, cuda or cuda:N (N a device index)")
      .tooltip("auto picks cuda when available, else cpu; cuda:1 is the second GPU."));
  // SimpleTuner's (sections/advanced.py): there a DeepSpeed config for accelerate; remat reads
  // its ZeRO stage and implements stage 1 itself (remat/train/optimizers/zero_optimizer.h).
  add(Opt(kRuntime, "deepspeed_config", T::String, bind_field(&C::deepspeed_config),
          "Shard the optimizer state across processes (ZeRO stage 1): zero1, or DeepSpeed JSON "
          "(text or a file) with zero_optimization.stage 1")
      .nullable()
      .depends("model_type", "full")
      .tooltip("For a full fine-tune on several processes (torchrun, remat launch): each process keeps "
               "and updates the AdamW state of its share of the weights only, then sends the updated "
               "weights to the others, so the optimizer state per GPU is about 1/N of the whole; the "
               "weights are exactly those of plain data parallel. Accepts SimpleTuner's preset value "
               "zero1, raw JSON ({\"zero_optimization\": {\"stage\": 1}}) or a path to a JSON file; "
               "remat reads only the stage and ignores the other DeepSpeed keys (with a warning). "
               "Stages 2 and 3 are refused (remat implements stage 1). Needs optimizer torch-adamw or "
               "optimi-lion."));
  add(Opt(kRuntime, "torch_num_threads", T::Int, bind_field(&C::torch_num_threads),
          "CPU threads for LibTorch and the BLAS it calls (0: one per physical core)").min(0).max(kMaxNumThreads)
      .alias("num_threads")
      .tooltip("SimpleTuner's default is 8; remat uses one thread per physical core unless this is set. The "
               "BLAS's own pool (OpenBLAS on Debian) is set to the same count, and the run prints both."));
  add(Opt(kRuntime, "report_every", T::Int, bind_field(&C::report_every),
          "Log loss, learning rate, step time and peak memory every N steps").min(1).max(kMaxTrainSteps));
  // remat's own: SimpleTuner has no memory admission to override.
  add(Opt(kRuntime, "skip_memory_check", T::Bool, bind_field(&C::skip_memory_check),
          "Build the model even when its predicted memory exceeds what the device has available")
      .tooltip("Before the model is allocated, its weights (and the gradients and optimizer state of "
               "the trainable parameters) are predicted from its config and compared with the "
               "device's available memory; a model that cannot fit is refused with both figures and "
               "the options that would make it fit. This skips that check."));
  add(Opt(kRuntime, "ignore_unsupported_options", T::Bool, bind_field(&C::ignore_unsupported_options),
          "Train even when the config sets SimpleTuner options that change what training computes "
          "and remat does not implement yet (they are ignored, with a warning)"));
  // clang-format on
  // The families' own options, each placed at the end of its section.
  for (const ModelFamily* f : model_families()) {
    if (!f->options) continue;
    for (auto& spec : f->options()) r.push_back(std::move(spec));
  }
  const std::vector<std::string> order = {kModel, kLora, kOptim, kTraining, kEma, kFlow, kCkpt, kData, kValidation, kRuntime};
  const auto rank = [&](const OptionSpec& spec) {
    return std::find(order.begin(), order.end(), spec.section) - order.begin();
  };
  std::stable_sort(r.begin(), r.end(),
                   [&](const OptionSpec& a, const OptionSpec& b) { return rank(a) < rank(b); });
  for (size_t i = 0; i < r.size(); ++i) r[i].order = static_cast<int>(i);
  return r;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_of(std::string_view word, const std::vector<std::string>& candidates,
                       size_t* distance = nullptr) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  if (distance) *distance = best_d;
  return best;
}

// How far a misspelling may be from what was meant: 1 edit in short words, 2 up to 12
// characters, 3 beyond. Further than that a suggestion is a guess (data_backend_config is not a
// misspelling of adam_epsilon).
size_t close_enough(std::string_view word) {
  return word.size() <= 4 ? 1 : word.size() <= 12 ? 2 : 3;
}

// " (did you mean 'x'?)" when a candidate is close enough, else "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  size_t d = 0;
  const std::string best = closest_of(word, candidates, &d);
  if (best.empty() || d > close_enough(word)) return "";
  return " (did you mean '" + best + "'?)";
}


std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return render_float(v);
}

// "an integer >= 1", "a number in [0, 1]", "one of a, b", plus keywords and "unset".
std::string describe_valid(const OptionSpec& spec) {
  std::string d;
  std::string range;
  if (spec.minimum && spec.maximum) {
    range = std::string(" in ") + (spec.exclusive_minimum ? "(" : "[") + number_text(*spec.minimum) +
            ", " + number_text(*spec.maximum) + "]";
  } else if (spec.minimum) {
    range = (spec.exclusive_minimum ? " > " : " >= ") + number_text(*spec.minimum);
  } else if (spec.maximum) {
    range = " <= " + number_text(*spec.maximum);
  }
  switch (spec.type) {
    case T::Bool: d = "true or false"; break;
    case T::Int: d = "an integer" + range; break;
    case T::Float: d = "a number" + range; break;
    case T::String: d = spec.pattern.empty() ? "a string" : spec.pattern_description; break;
    case T::Choice: d = "one of " + join(spec.choices, ", "); break;
    case T::Path: d = "a path"; break;
    case T::Bytes:
      d = "a byte size such as 20GiB, 512MiB or 1.5GB";
      if (spec.minimum) d += " (at least " + number_text(*spec.minimum) + " bytes)";
      break;
  }
  for (const auto& k : spec.keywords) d += " or " + k;
  if (spec.type == T::Choice && !spec.value_aliases.empty()) {
    d += " (";
    bool first = true;
    for (const auto& [old, current] : spec.value_aliases) {
      d += (first ? "" : ", ") + old + " is read as " + current;
      first = false;
    }
    d += ")";
  }
  if (spec.nullable) d += ", or none to leave unset";
  return d;
}

[[noreturn]] void invalid(const OptionSpec& spec, const std::string& text, const std::string& extra = "") {
  throw ValidationError(spec.name, text,
                        "[train] " + spec.name + " must be " + describe_valid(spec) + ", got '" + text +
                            "'" + extra);
}

void check_range(const OptionSpec& spec, double v, const std::string& text) {
  const bool below = spec.minimum && (spec.exclusive_minimum ? v <= *spec.minimum : v < *spec.minimum);
  const bool above = spec.maximum && v > *spec.maximum;
  if (below || above) invalid(spec, text);
}

bool is_unset_word(const std::string& text) {
  const std::string l = lower(text);
  return l.empty() || l == "none" || l == "null";
}

}  // namespace

std::string option_type_name(OptionType type) {
  switch (type) {
    case T::Bool: return "bool";
    case T::Int: return "int";
    case T::Float: return "float";
    case T::String: return "string";
    case T::Choice: return "choice";
    case T::Path: return "path";
    case T::Bytes: return "bytes";
  }
  return "unknown";
}

std::string OptionSpec::doc_anchor() const { return "docs/OPTIONS.md#--" + name; }

std::string OptionSpec::signature() const {
  std::string s = option_type_name(type);
  if (type == T::Choice) s += ": " + join(choices, "|");
  if (type == T::String && !pattern.empty()) s += ": " + pattern_description;
  if (type == T::Int || type == T::Float) {
    if (minimum && maximum) {
      s += std::string(" in ") + (exclusive_minimum ? "(" : "[") + number_text(*minimum) + ", " +
           number_text(*maximum) + "]";
    } else if (minimum) {
      s += (exclusive_minimum ? " > " : " >= ") + number_text(*minimum);
    }
  }
  for (const auto& k : keywords) s += " | " + k;
  s += ", default ";
  s += !default_note.empty() ? default_note : default_value ? *default_value : std::string("unset");
  return s;
}

const std::vector<OptionSpec>& option_specs() {
  // Rebuilt when a family registers (its name, presets and options join the registry).
  static std::vector<OptionSpec> registry;
  static uint64_t built_for = ~uint64_t{0};
  if (built_for != model_family_generation()) {
    registry = build_registry();
    built_for = model_family_generation();
  }
  return registry;
}

const std::vector<std::string>& option_sections() {
  static std::vector<std::string> sections;
  sections.clear();
  for (const auto& spec : option_specs()) {
    if (std::find(sections.begin(), sections.end(), spec.section) == sections.end()) {
      sections.push_back(spec.section);
    }
  }
  return sections;
}

const OptionSpec* find_option(std::string_view name) {
  while (!name.empty() && name.front() == '-') name.remove_prefix(1);
  for (const auto& spec : option_specs()) {
    if (spec.name == name) return &spec;
    for (const auto& a : spec.aliases) {
      if (a == name) return &spec;
    }
  }
  return nullptr;
}

std::string closest_option(std::string_view name) {
  while (!name.empty() && name.front() == '-') name.remove_prefix(1);
  std::vector<std::string> names;
  for (const auto& spec : option_specs()) {
    names.push_back(spec.name);
    names.insert(names.end(), spec.aliases.begin(), spec.aliases.end());
  }
  const std::string best = closest_of(name, names);
  const OptionSpec* spec = find_option(best);
  return spec ? spec->name : best;
}

std::optional<std::string> suggest_option(std::string_view name) {
  while (!name.empty() && name.front() == '-') name.remove_prefix(1);
  std::vector<std::string> names;
  for (const auto& spec : option_specs()) {
    names.push_back(spec.name);
    names.insert(names.end(), spec.aliases.begin(), spec.aliases.end());
  }
  for (const auto& st : simpletuner_options()) names.push_back(st.name);
  size_t d = 0;
  const std::string best = closest_of(name, names, &d);
  if (best.empty() || d > close_enough(name)) return std::nullopt;
  const OptionSpec* spec = find_option(best);
  return spec ? spec->name : best;
}

// CheckpointInterval's text is this registry's row of gradient_checkpointing_interval: its range
// and keyword are checked here, once.
CheckpointInterval CheckpointInterval::parse(const std::optional<std::string>& text) {
  const OptionSpec* spec = find_option("gradient_checkpointing_interval");
  const OptionValue value = parse_option_value(*spec, text);
  CheckpointInterval interval;
  if (std::holds_alternative<std::string>(value)) interval.blocks_ = kAuto;  // the keyword "auto"
  else if (const auto* n = std::get_if<int64_t>(&value)) interval.blocks_ = *n;
  return interval;
}

CheckpointInterval CheckpointInterval::blocks(int64_t n) { return parse(std::to_string(n)); }

CheckpointInterval CheckpointInterval::automatic() {
  CheckpointInterval interval;
  interval.blocks_ = kAuto;
  return interval;
}

std::optional<std::string> CheckpointInterval::text() const {
  if (is_auto()) return std::string("auto");
  if (per_block()) return std::nullopt;
  return std::to_string(blocks_);
}

OptionValue parse_option_value(const OptionSpec& spec, const std::optional<std::string>& maybe_text) {
  // null and "" mean "the default" for every option (SimpleTuner drops such keys); the words
  // none / null unset the options that may be unset.
  if (!maybe_text || maybe_text->empty()) {
    if (!spec.default_value) return std::monostate{};
    return parse_option_value(spec, spec.default_value);
  }
  if (spec.nullable && is_unset_word(*maybe_text)) return std::monostate{};
  const std::string& text = *maybe_text;
  for (const auto& k : spec.keywords) {
    if (lower(text) == k) return k;
  }
  switch (spec.type) {
    case T::Bool: {
      const std::string l = lower(text);
      if (l == "true" || l == "1" || l == "yes" || l == "on") return true;
      if (l == "false" || l == "0" || l == "no" || l == "off") return false;
      invalid(spec, text);
    }
    case T::Int: {
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(text.c_str(), &end, 10);
      if (!text.empty() && !std::isspace(static_cast<unsigned char>(text[0])) && *end == '\0' &&
          errno != ERANGE) {
        check_range(spec, static_cast<double>(v), text);
        return static_cast<int64_t>(v);
      }
      // An integral float ("16.0", "1e3", what JSON writers produce) is that integer; any
      // fraction is an error.
      errno = 0;
      const double f = std::strtod(text.c_str(), &end);
      if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || *end != '\0' ||
          !std::isfinite(f) || f != std::floor(f) || std::fabs(f) > 9.007199254740992e15) {
        invalid(spec, text);
      }
      check_range(spec, f, text);
      return static_cast<int64_t>(f);
    }
    case T::Float: {
      errno = 0;
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || *end != '\0' ||
          !std::isfinite(v)) {
        invalid(spec, text);
      }
      check_range(spec, v, text);
      return v;
    }
    case T::String:
      if (!spec.pattern.empty() && !std::regex_match(text, std::regex(spec.pattern))) invalid(spec, text);
      return text;
    case T::Path:
      return text;
    case T::Choice: {
      if (std::find(spec.choices.begin(), spec.choices.end(), text) != spec.choices.end()) return text;
      const auto alias = spec.value_aliases.find(text);
      if (alias != spec.value_aliases.end()) return alias->second;
      invalid(spec, text, did_you_mean(text, spec.choices));
    }
    case T::Bytes: {
      const int64_t v = parse_bytes(text, spec.name);
      check_range(spec, static_cast<double>(v), text);
      return v;
    }
  }
  invalid(spec, text);
}

}  // namespace remat::train
