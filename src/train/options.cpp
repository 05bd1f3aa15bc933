// The options registry: the one table of `remat train` options, and the typing and validation of
// values against it. Help text, JSON export and docs are generated from it in options_docs.cpp.
//
// Defaults are not written here: each option binds a TrainConfig field, and its default is read
// from a default-constructed TrainConfig, so the struct's initialisers are the only source.
// Names, defaults, help lines and tooltips follow SimpleTuner's field registry
// (simpletuner_sdk/server/services/field_registry/sections/*.py) unless a comment says otherwise.
#include "remat/train/options.h"

#include "option_builder.h"

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
#include "remat/train/family.h"

namespace remat::train {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Upper bounds of the integer options (every one has one: values come from files and flags, and
// an unbounded count overflowed or hung; Note [Option bounds]). kMaxTrainSteps and
// kMaxNumThreads are in remat/train/config.h, where the trainer and the benchmark use them too.
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
const char* const kCkpt = "Gradient checkpointing";
const char* const kData = "Data and output";
const char* const kRuntime = "Runtime";

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::vector<OptionSpec> build_registry() {
  std::vector<OptionSpec> r;
  const auto add = [&r](Opt o) { r.push_back(o.done()); };
  // clang-format off
  // ---- Model ----
  // The families' names, presets and defaults come from the family registry.
  std::vector<std::string> family_names, all_flavours, default_flavours;
  std::map<std::string, std::vector<std::string>> flavours_by_family;
  std::vector<std::string> family_titles;
  for (const ModelFamily* f : model_families()) {
    family_names.push_back(f->name);
    family_titles.push_back(f->display_name.empty() ? f->name : f->display_name);
    all_flavours.insert(all_flavours.end(), f->flavours.begin(), f->flavours.end());
    default_flavours.push_back(f->default_flavour);
    flavours_by_family[f->name] = f->flavours;
  }
  add(Opt(kModel, "model_family", T::Choice, bind_field(&C::model_family),
          "The architecture to train: " + join(family_titles, " or "))
      .choices(family_names));
  add(Opt(kModel, "model_flavour", T::Choice, bind_field(&C::model_flavour),
          "Preset of the model family (number of blocks, widths)")
      .choices(all_flavours)
      .choices_by("model_family", flavours_by_family)
      .nullable()
      .tooltip("Must belong to model_family. The -tiny and -small presets are small configurations "
               "for tests and benchmarks.")
      .default_note("unset (the family's default: " + join(default_flavours, ", ") + ")"));
  add(Opt(kModel, "pretrained_model_name_or_path", T::Path, bind_field(&C::pretrained_model_name_or_path),
          "Transformer weights: a .safetensors file with diffusers key names")
      .nullable()
      .tooltip("Unset: the transformer is initialised randomly (a warning is logged)."));
  add(Opt(kModel, "pretrained_transformer_config", T::Path, bind_field(&C::pretrained_transformer_config),
          "A transformer config.json (diffusers format) overriding the flavour's shapes")
      .nullable());
  add(Opt(kModel, "model_type", T::Choice, bind_field(&C::model_type),
          "Train every weight (full) or low-rank adapters (lora)")
      .choices({"full", "lora"}));
  // ---- LoRA ----
  add(Opt(kLora, "lora_rank", T::Int, bind_field(&C::lora_rank), "Dimension of LoRA update matrices")
      .min(1).max(kMaxLoraRank).depends("model_type", "lora"));
  add(Opt(kLora, "lora_alpha", T::Float, bind_field(&C::lora_alpha),
          "Scales the LoRA effect: scale = lora_alpha / lora_rank (usually equal to rank)")
      .min(0, true).nullable().depends("model_type", "lora").default_note("unset (= lora_rank)"));
  // ---- Optimizer and learning rate ----
  add(Opt(kOptim, "learning_rate", T::Float, bind_field(&C::learning_rate), "Base learning rate for training")
      .min(0).max(1)
      .tooltip("Controls how much model weights change per step. Lower = more stable but slower. "
               "Typical range: 1e-6 to 1e-4"));
  // SimpleTuner defaults to adamw_bf16; remat implements plain AdamW only.
  add(Opt(kOptim, "optimizer", T::Choice, bind_field(&C::optimizer),
          "The optimizer (AdamW with decoupled weight decay)")
      .choices({"adamw"}));
  add(Opt(kOptim, "adam_beta1", T::Float, bind_field(&C::adam_beta1),
          "First moment decay rate for Adam optimizers").min(0).max(1));
  add(Opt(kOptim, "adam_beta2", T::Float, bind_field(&C::adam_beta2),
          "Second moment decay rate for Adam optimizers").min(0).max(1));
  add(Opt(kOptim, "adam_epsilon", T::Float, bind_field(&C::adam_epsilon),
          "Small constant added for numerical stability").min(0));
  add(Opt(kOptim, "adam_weight_decay", T::Float, bind_field(&C::adam_weight_decay),
          "L2 regularisation strength for Adam-family optimizers").min(0));
  add(Opt(kOptim, "lr_scheduler", T::Choice, bind_field(&C::lr_scheduler),
          "How learning rate changes during training")
      .choices({"constant", "constant_with_warmup", "cosine"})
      .tooltip("constant with lr_warmup_steps > 0 is treated as constant_with_warmup, as in "
               "SimpleTuner. cosine decays to 0 at the last step after the warmup."));
  add(Opt(kOptim, "lr_warmup_steps", T::Int, bind_field(&C::lr_warmup_steps),
          "Number of steps to gradually increase LR from 0").min(0).max(kMaxTrainSteps));
  add(Opt(kOptim, "max_grad_norm", T::Float, bind_field(&C::max_grad_norm),
          "Gradient clipping threshold to prevent exploding gradients (0 disables clipping)").min(0));
  // ---- Training ----
  add(Opt(kTraining, "train_batch_size", T::Int, bind_field(&C::train_batch_size),
          "Number of samples processed per forward/backward pass").min(1).max(kMaxBatch));
  add(Opt(kTraining, "gradient_accumulation_steps", T::Int, bind_field(&C::gradient_accumulation_steps),
          "Number of steps to accumulate gradients").min(1).max(kMaxBatch));
  add(Opt(kTraining, "max_train_steps", T::Int, bind_field(&C::max_train_steps),
          "Maximum number of training steps (0 = use epochs instead)").min(0).max(kMaxTrainSteps));
  add(Opt(kTraining, "num_train_epochs", T::Int, bind_field(&C::num_train_epochs),
          "Number of passes over the data when max_train_steps is 0").min(1).max(kMaxEpochs)
      .tooltip("The steps it works out to (epochs x batches per epoch / gradient_accumulation_steps) "
               "must also be at most " + std::to_string(kMaxTrainSteps) + "."));
  // [0, 2^32 - 1]: the seeds numpy accepts, to which SimpleTuner passes its seed.
  add(Opt(kTraining, "seed", T::Int, bind_field(&C::seed), "Seed used for deterministic training behaviour")
      .min(0).max(kMaxSeed).nullable().tooltip("Unset: a random seed, logged at start."));
  add(Opt(kTraining, "mixed_precision", T::Choice, bind_field(&C::mixed_precision),
          "Precision for training computations")
      .choices({"no", "bf16"})
      .tooltip("bf16 runs the transformer under bfloat16 autocast with fp32 master weights; no "
               "trains in fp32."));
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
  add(Opt(kCkpt, "gradient_checkpointing", T::Bool, bind_field(&C::gradient_checkpointing),
          "Trade compute for memory by recomputing activations")
      .checkpointing()
      .tooltip("Checkpointed blocks keep only their inputs during the forward pass and run again "
               "during backward to rebuild the rest."));
  add(Opt(kCkpt, "gradient_checkpointing_interval", T::Int, bind_interval(),
          "Checkpoint contiguous chunks of N transformer blocks (leave blank for per-block "
          "checkpointing)")
      .min(1).max(kMaxBlocks).keywords({"auto"}).nullable().checkpointing()
      .depends("gradient_checkpointing", "true")
      .tooltip("Higher values reduce recompute overhead but keep more activations in memory. Flux "
               "and MageFlow use contiguous chunked checkpointing on whole-block paths."));
  add(Opt(kCkpt, "gradient_checkpointing_segment_stride", T::Int,
          bind_field(&C::gradient_checkpointing_segment_stride),
          "Start a checkpointed chunk every N blocks; the blocks between chunks keep their "
          "activations (leave blank for N = interval)")
      .min(1).max(kMaxBlocks).nullable().checkpointing().depends("gradient_checkpointing", "true")
      .at_least("gradient_checkpointing_interval")
      .tooltip("Must be at least the interval; needs an interval. With interval 2 and stride 4, "
               "blocks 0-1 are checkpointed, 2-3 run normally, 4-5 are checkpointed, and so on."));
  add(Opt(kCkpt, "gradient_checkpointing_backend", T::Choice, bind_field(&C::gradient_checkpointing_backend),
          "Backend and scope for gradient checkpointing. torch recomputes activations; unsloth "
          "offloads the saved block inputs to pinned host memory")
      .choices(CheckpointPlan::backend_names())
      .checkpointing().depends("gradient_checkpointing", "true")
      .tooltip("FFN-only variants (-ffn) checkpoint the feed-forward half of each block and do not "
               "use contiguous chunks. unsloth needs CUDA: on CPU the saved tensors stay in place."));
  add(Opt(kCkpt, "gradient_checkpointing_memory_budget", T::Bytes,
          bind_field(&C::gradient_checkpointing_memory_budget, /*bytes=*/true),
          "Peak memory budget of a training step (weights, gradients, optimizer state and "
          "activations) for gradient_checkpointing_interval=auto, e.g. 20GiB, 512MiB, 1.5GB")
      .min(1).nullable().checkpointing()
      .depends("gradient_checkpointing", "true").depends("gradient_checkpointing_interval", "auto")
      .tooltip("The budget planner chooses, per block, keep / recompute / offload so that the "
               "predicted peak of the whole step fits this budget with the least predicted step "
               "time. Unset: what the device has free. KiB/MiB/GiB are powers of 1024, KB/MB/GB "
               "powers of 1000."));
  // ---- Data and output ----
  add(Opt(kData, "instance_data_dir", T::Path, bind_field(&C::instance_data_dir),
          "Directory with the training data").nullable());
  // SimpleTuner's default is "simpletuner-results"; this tool names its own.
  add(Opt(kData, "output_dir", T::Path, bind_field(&C::output_dir),
          "Directory where model checkpoints and logs will be saved"));
  add(Opt(kData, "checkpointing_steps", T::Int, bind_field(&C::checkpointing_steps),
          "Save a training checkpoint every N steps (0: only at the end)")
      .min(0).max(kMaxTrainSteps).alias("checkpoint_step_interval")
      .tooltip("SimpleTuner's newer name checkpoint_step_interval is accepted too."));
  add(Opt(kData, "checkpoints_total_limit", T::Int, bind_field(&C::checkpoints_total_limit),
          "Maximum number of checkpoints to keep on disk (0 keeps all)").min(0).max(kMaxCheckpointsKept));
  add(Opt(kData, "resume_from_checkpoint", T::Path, bind_field(&C::resume_from_checkpoint),
          "Select checkpoint to resume training from: a checkpoint directory, or latest")
      .keywords({"latest"}).nullable()
      .tooltip("latest resumes from the newest checkpoint in output_dir and starts fresh when there "
               "is none. Leave blank to start from scratch."));
  // ---- Runtime ----
  add(Opt(kRuntime, "device", T::String, bind_field(&C::device), "Device to train on: auto, cpu, cuda or cuda:N")
      .pattern("auto|cpu|cuda(:[0-9]+)?", "auto, cpu, cuda or cuda:N (N a device index)")
      .tooltip("auto picks cuda when available, else cpu; cuda:1 is the second GPU."));
  add(Opt(kRuntime, "num_threads", T::Int, bind_field(&C::num_threads),
          "CPU threads for LibTorch (0 keeps LibTorch's default)").min(0).max(kMaxNumThreads));
  add(Opt(kRuntime, "report_every", T::Int, bind_field(&C::report_every),
          "Log loss, learning rate, step time and peak memory every N steps").min(1).max(kMaxTrainSteps));
  // remat's own: SimpleTuner has no memory admission to override.
  add(Opt(kRuntime, "skip_memory_check", T::Bool, bind_field(&C::skip_memory_check),
          "Build the model even when its predicted memory exceeds what the device has available")
      .tooltip("Before the model is allocated, its weights (and the gradients and AdamW state of the "
               "trainable parameters) are predicted from its config and compared with the device's "
               "available memory; a model that cannot fit is refused with both figures and the options "
               "that would make it fit. This skips that check."));
  // clang-format on
  // The families' own options, each placed at the end of its section.
  for (const ModelFamily* f : model_families()) {
    if (!f->options) continue;
    for (auto& spec : f->options()) r.push_back(std::move(spec));
  }
  const std::vector<std::string> order = {kModel, kLora, kOptim, kTraining, kFlow, kCkpt, kData, kRuntime};
  const auto rank = [&](const OptionSpec& spec) {
    return std::find(order.begin(), order.end(), spec.section) - order.begin();
  };
  std::stable_sort(r.begin(), r.end(),
                   [&](const OptionSpec& a, const OptionSpec& b) { return rank(a) < rank(b); });
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

std::string closest_of(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
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
  if (spec.nullable) d += ", or blank to leave unset";
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

OptionValue parse_option_value(const OptionSpec& spec, const std::optional<std::string>& maybe_text) {
  if (!maybe_text || (spec.nullable && is_unset_word(*maybe_text))) {
    if (!spec.nullable) invalid(spec, maybe_text ? *maybe_text : "null");
    return std::monostate{};
  }
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
      if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || *end != '\0' ||
          errno == ERANGE) {
        invalid(spec, text);
      }
      check_range(spec, static_cast<double>(v), text);
      return static_cast<int64_t>(v);
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
      if (text.empty()) invalid(spec, text);
      return text;
    case T::Choice: {
      if (std::find(spec.choices.begin(), spec.choices.end(), text) != spec.choices.end()) return text;
      invalid(spec, text, " (did you mean '" + closest_of(text, spec.choices) + "'?)");
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
