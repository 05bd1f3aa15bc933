// The training loop of `remat train`. See Note [Exact resume] for what makes 5 steps + resume +
// 5 steps equal 10 steps bit for bit.
#include "string_helpers.h"
#include "remat/threads.h"
#include "remat/train/run/trainer.h"

#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/distributed/environment.h"
#include "remat/distributed/gradient_reducer.h"
#include "remat/distributed/process_group.h"
#include "remat/io/safetensors.h"
#include "remat/models/lora.h"
#include "remat/models/lora_formats.h"
#include "remat/memory.h"
#include "remat/util/error.h"
#include "remat/train/family/model_source.h"
#include "remat/util/files.h"
#include "remat/train/memory/admission.h"
#include "remat/train/memory/base_precision.h"
#include "remat/train/memory/auto_layout.h"
#include "remat/train/data/data.h"
#include "remat/train/family/family.h"
#include "remat/train/data/image_data.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/run/reducer_synchronizer.h"
#include "remat/train/optimizers/lr_schedule.h"
#include "remat/train/run/startup_checks.h"
#include "remat/train/run/ema.h"
#include "remat/train/run/step.h"
#include "remat/train/run/training_state.h"
#include "remat/train/family/transformer.h"
#include "remat/train/validation/validation_images.h"
#include "remat/train/optimizers/zero_optimizer.h"

#include "run/data_parallel.h"

// Note [Exact resume]
// A run is a deterministic function of (config, seed) when every source of variation is saved:
//   - the data order is recomputed from (seed, epoch); the checkpoint stores the position;
//   - noise and sigmas come from the trainer's own CPU generator, saved with the global CPU
//     generator (dropout, anything else) and, on CUDA, the device generator;
//   - the optimizer's per-parameter state (AdamW's moments and step count, AdamWBF16's buffers,
//     Lion's momentum) is saved; the learning rate is a pure function of the step;
//   - the trainable weights are saved exactly (float32 bits).
// Frozen weights are rebuilt from the same seed or pretrained file, so they need no saving.
// Several processes: every rank computes the same weights (Note [One run, any world size]);
// rank 0 writes the checkpoint, with its generator states, and every rank restores from it.
// Validation images draw nothing from these generators (Note [Validation and the training run]).

namespace remat::train {
namespace fs = std::filesystem;
namespace {

using remat::detail::render_number;

std::vector<io::NamedTensor> generator_states(const at::Generator& noise, const at::Device& device) {
  std::vector<io::NamedTensor> states;
  states.emplace_back("noise", noise.get_state());
  states.emplace_back("cpu", at::detail::getDefaultCPUGenerator().get_state());
  if (device.is_cuda()) {
    states.emplace_back("cuda", at::globalContext().defaultGenerator(device).get_state());
  }
  return states;
}

void restore_generators(const std::vector<io::NamedTensor>& states, at::Generator& noise,
                        const at::Device& device) {
  for (const auto& [name, state] : states) {
    if (name == "noise") {
      noise.set_state(state);
    } else if (name == "cpu") {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    } else if (name == "cuda" && device.is_cuda()) {
      auto gen = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
  }
}

std::vector<int64_t> tensor_bytes(const std::vector<at::Tensor>& tensors) {
  std::vector<int64_t> bytes;
  for (const auto& t : tensors) bytes.push_back(static_cast<int64_t>(t.numel() * t.element_size()));
  return bytes;
}

int64_t total_bytes(const std::vector<at::Tensor>& tensors) {
  int64_t sum = 0;
  for (const auto b : tensor_bytes(tensors)) sum += b;
  return sum;
}

class Trainer {
 public:
  Trainer(const TrainConfig& config, const TrainerHooks& hooks)
      : config_(config),
        hooks_(hooks),
        family_(model_family(config.model_family)),
        device_(at::Device(config.device)) {
    if (!hooks_.log) hooks_.log = [](const std::string& line) { std::cerr << line << "\n"; };
  }

  TrainResult run();

 private:
  void setup();
  void plan_checkpointing();
  void train_step(int64_t step);
  void flush_records(TrainResult& result, MetricsWriter* metrics, ProgressReporter& progress);
  void stop_if_not_finite(const StepRecord& record, const TrainResult& result) const;
  std::string latest_checkpoint_text() const;
  /// Advances to the run's next batch; loads it (with its noise seed) when `load`.
  std::optional<Batch> next_batch(bool load);
  void setup_image_data();
  void plan_epoch(int64_t epoch);
  int64_t epoch_length() const;
  Batch read_batch(int64_t i) const;
  std::string save_checkpoint();
  void validate(int64_t step, TrainResult& result);
  void render_validation(int64_t step, TrainResult& result);
  void save_weights(TrainResult& result);
  std::string write_weights(const fs::path& lora_dir, const fs::path& full_file);
  void start_ema();
  void resume(const std::string& path, int64_t batches_per_epoch);
  int64_t steps_for_epochs(int64_t batches_per_epoch) const;
  void join_other_ranks();
  void start_gradient_sync();
  /// Micro-batches per optimizer step over all ranks (gradient_accumulation_steps x world size).
  int64_t batches_per_step() const { return config_.gradient_accumulation_steps * env_.world_size; }
  bool main_rank() const { return env_.is_main(); }
  /// Waits for every rank (several processes; no-op for one).
  void barrier(const std::string& why) {
    if (group_) group_->barrier(why);
  }
  bool any_rank_stopping();

  // A step whose loss and gradient norm are still on the device (Note [Reading the loss]).
  struct PendingRecord {
    StepRecord record;
    StepResult result;
    distributed::ProcessGroup::PendingSum loss_sum;  ///< several processes: the losses of every rank
  };

  TrainConfig config_;
  TrainerHooks hooks_;
  const ModelFamily& family_;
  at::Device device_;
  int64_t seed_ = 0;
  std::optional<LatentDataset> data_;     // a latent-cache directory, or
  std::optional<MultiDataset> images_;   // the cached samples of an image run
  std::vector<PlannedBatch> image_order_;
  std::unique_ptr<Transformer> model_;
  std::vector<std::pair<std::string, at::Tensor>> trainable_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LrSchedule schedule_;
  std::vector<at::Tensor> params_;   // the trainable tensors, in trainable_ order
  StepSettings step_settings_;
  std::unique_ptr<TrainingStep> step_;
  PeakMemoryObserver peak_;
  std::vector<PendingRecord> pending_;
  at::Generator noise_generator_;
  TrainingPosition position_;
  std::vector<std::vector<int64_t>> epoch_order_;
  int64_t total_steps_ = 0;
  std::unique_ptr<ValidationRenderer> validation_;  // when the run renders validation images
  std::unique_ptr<ExponentialMovingAverage> ema_;   // use_ema
  // Several processes (Note [One run, any world size]): set up by join_other_ranks.
  distributed::LaunchEnvironment env_;
  std::unique_ptr<distributed::ProcessGroup> group_;
  std::unique_ptr<distributed::GradientReducer> reducer_;
  std::unique_ptr<ReducerSynchronizer> gradient_sync_;
  ZeroRedundancyOptimizer* zero_ = nullptr;  // optimizer_, when deepspeed_config asks for ZeRO-1
};

// The other processes of the run, from torchrun's environment: the process group forms, the
// ranks check they run one configuration, and each trains on its own device (cuda:LOCAL_RANK).
void Trainer::join_other_ranks() {
  if (!env_.distributed()) return;
  if (device_.is_cuda()) device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env_.local_rank));
  const char* requested = std::getenv(distributed::kBackendVariable);
  const auto backend = distributed::choose_backend(requested ? requested : "auto", device_);
  hooks_.log("[distributed] " + env_.describe() + " (local rank " + std::to_string(env_.local_rank) + " of " +
             std::to_string(env_.local_world_size) + "), " + distributed::to_string(backend) + " on " + device_.str() +
             ", rendezvous " + env_.master_addr + ":" + std::to_string(env_.master_port) + ", timeout " +
             std::to_string(env_.timeout.count()) + " s");
  group_ = distributed::ProcessGroup::connect(env_, backend);
  group_->check_same_on_all_ranks("the configuration", canonical_config_text(config_));
  hooks_.log("[distributed] global batch " + std::to_string(env_.world_size * config_.train_batch_size *
                                                            config_.gradient_accumulation_steps) +
             " = " + std::to_string(env_.world_size) + " processes x train_batch_size " +
             std::to_string(config_.train_batch_size) + " x gradient_accumulation_steps " +
             std::to_string(config_.gradient_accumulation_steps));
}

// Several processes: rank 0's trainable weights everywhere (they are equal already when built
// from one seed or file; this makes it so whatever the source), then the gradient reducer.
void Trainer::start_gradient_sync() {
  if (!group_) return;
  {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> weights(params_.begin(), params_.end());
    group_->broadcast(weights, 0, "sending rank 0's trainable weights");
  }
  std::vector<std::string> names;
  for (const auto& [name, p] : trainable_) names.push_back(name);
  reducer_ = std::make_unique<distributed::GradientReducer>(*group_, params_, names);
  gradient_sync_ = std::make_unique<ReducerSynchronizer>(*reducer_);
  step_->set_gradient_synchronizer(gradient_sync_.get());
  hooks_.log("[distributed] gradients of " + std::to_string(params_.size()) + " trainable tensors all-reduced in " +
             std::to_string(reducer_->bucket_count()) + " bucket(s) during backward");
}

// The launcher's Ctrl-C reaches every rank, but not within the same step: the ranks agree to stop
// when any of them was asked to.
bool Trainer::any_rank_stopping() {
  const bool here = hooks_.stop_requested && hooks_.stop_requested->load();
  if (!group_) return here;
  std::vector<at::Tensor> flag{at::full({1}, here ? 1.0f : 0.0f)};
  group_->all_reduce_sum(flag, "agreeing whether to stop");
  return flag[0].item<float>() > 0;
}

void Trainer::setup() {
  hooks_.log("[train] threads: " + describe(set_cpu_threads(config_.torch_num_threads)));
  env_ = distributed::read_launch_environment();
  seed_ = config_.seed.value_or(static_cast<int64_t>(std::random_device{}() & 0x7fffffff));
  TORCH_CHECK_VALUE(config_.seed || !env_.distributed(), "[train] ", env_.world_size,
                    " processes need a seed (--seed) so that every rank builds the same model and data order");
  check_zero_run(config_.zero_stage, config_.model_type, config_.optimizer, env_.world_size);
  torch::manual_seed(static_cast<uint64_t>(seed_));
  noise_generator_ = at::detail::createCPUGenerator(static_cast<uint64_t>(seed_) ^ 0x9e3779b97f4a7c15ULL);

  // Note [Startup checks]: everything a user can get wrong is checked here, cheapest first and
  // before any model or data is loaded or any output written: the paths, the checkpoint names,
  // the model's memory, the data's shapes against the model. A run that fails, fails in seconds
  // with the option named, and leaves no metrics.jsonl behind.
  const bool image_run = is_image_run(config_);
  if (!config_.instance_data_dir && !image_run) {
    throw ValidationError("instance_data_dir", "",
                          "[train] instance_data_dir must name a latent-cache directory (one "
                          ".safetensors per sample; `remat make-demo-data --output DIR` writes one) or a "
                          "folder of pictures with captions, or set data_backend_config");
  }
  if (!image_run) check_data_dir(*config_.instance_data_dir);
  if (!image_run && config_.data_backend_config) {
    hooks_.log("[train] instance_data_dir '" + *config_.instance_data_dir + "' is a latent cache: training on it; " +
               "data_backend_config '" + *config_.data_backend_config + "' is not read");
  }
  check_output_dir(config_.output_dir);
  join_other_ranks();
  if (main_rank()) {  // rank 0 alone writes into output_dir
    for (const auto& line : remove_stale_checkpoint_temporaries(config_.output_dir)) {
      hooks_.log("[train] interrupted checkpoint save: " + line);
    }
  }
  list_training_checkpoints(config_.output_dir);  // names it cannot read fail now, not at the first prune
  std::optional<std::string> resume_path;
  if (config_.resume_from_checkpoint) {
    resume_path = resolve_resume_path(*config_.resume_from_checkpoint, config_.output_dir);
  }
  if (config_.validation_requested()) {
    // Cheap checks first: the family, the pipeline folder, the library and the resolutions.
    validation_pipeline_folder(config_);
    validation_prompts(config_);
    parse_validation_resolutions(config_.validation_resolution);
  }

  // An image run caches its latents and caption embeddings before the transformer loads, with
  // one encoder in memory at a time (Note [Startup checks] still holds: the datasets and the
  // pipeline folder are checked before any encoder loads).
  if (image_run) setup_image_data();
  // The validation prompts are encoded now, and the text encoders freed, before the transformer loads.
  if (config_.validation_requested() && main_rank()) {  // rank 0 alone renders
    validation_ = std::make_unique<ValidationRenderer>(
        config_, hooks_.log, images_ ? validation_edits(config_, *images_) : std::vector<ValidationEdit>{});
  }
  // The encoders are gone: their peak, which let freed host memory be kept for reuse, is not the
  // training step's (Note [Host blocks] in src/core/host_blocks.cpp).
  remat::memory::release_cached_host_memory();

  const ModelSource source = resolve_model_source(config_);
  TransformerSpec spec = transformer_spec_of(config_, source);
  spec.base_precision = base_precision_of(config_);
  hooks_.log("[train] " + source.describe());
  if (!config_.skip_memory_check) {
    ModelUse use;
    use.training = true;
    if (config_.model_type == "lora") {
      use.lora_rank = config_.lora_rank;
      use.lora_target = family_.lora_target(config_);
    }
    use.lora_flag = "--model_type=lora";
    use.base_precision = spec.base_precision;
    use.precision_flag = "--base_model_precision";
    use.world_size = env_.world_size;  // the prediction is per process
    use.zero_stage = config_.zero_stage;
    use.ema = ema_lives_on(config_, device_);
    use.blocks_to_swap = config_.musubi_blocks_to_swap;
    // A numeric interval puts that many swapped blocks in one checkpoint, all resident at once.
    use.swap_ring_slots = config_.gradient_checkpointing_interval.chunk().value_or(1) + 1;
    admit_model(spec, use, device_);
  }
  if (!image_run) data_ = LatentDataset::open(*config_.instance_data_dir, family_.latents);
  if (family_.conditioning) {
    const std::string name = spec.config_json ? "the model of " + *spec.config_json : spec.flavour;
    if (data_) check_dataset_fits_model(*data_, family_.conditioning(spec), name);
    if (images_) check_cached_images_fit_model(*images_, family_.conditioning(spec), name);
  }

  // With block swap the model is built on the host: the device never holds the swapped blocks
  // (set_block_swap below moves the rest).
  model_ = make_transformer(spec, config_.musubi_blocks_to_swap > 0 ? at::Device(at::kCPU) : device_);
  if (spec.base_precision.mode != models::WeightQuantization::none) {
    hooks_.log("[train] base weights: base_model_precision " + config_.base_model_precision + " (" +
               models::to_string(spec.base_precision.mode) +
               (spec.base_precision.double_quantization ? ", double-quantised scales" : "") +
               "): the blocks' Linears are stored quantised and dequantised per layer");
  }
  if (config_.model_type == "lora") {
    const std::string target = family_.lora_target(config_);
    const auto wrapped = model_->apply_lora(target, config_.lora_rank, config_.lora_alpha_value());
    hooks_.log("[train] LoRA rank " + std::to_string(config_.lora_rank) + " on " +
               std::to_string(wrapped.size()) + " modules (target '" + target + "')");
  }
  model_->module().train();
  if (config_.musubi_blocks_to_swap > 0) {
    const int64_t swapped = model_->set_block_swap(config_.musubi_blocks_to_swap, device_);
    const WeightStreamStats s = model_->block_swap()->stats();
    const bool trained = model_->block_swap()->trains_weights();
    if (trained && env_.world_size > 1) {
      // Data parallel's reducer keeps gradients as views into its buckets on the device; streamed
      // trained weights move theirs to the host.
      throw ValidationError("musubi_blocks_to_swap", std::to_string(config_.musubi_blocks_to_swap),
                            "[train] musubi_blocks_to_swap with model_type=" + config_.model_type +
                                " streams trained weights and their gradients to host memory, which data "
                                "parallel training (WORLD_SIZE " + std::to_string(env_.world_size) +
                                ") does not support; use model_type=lora, one process, or musubi_blocks_to_swap=0");
    }
    hooks_.log("[train] block swap: the last " + std::to_string(swapped) + " blocks' " +
               (trained ? "weights, gradients and optimizer state (weights " : "frozen weights (") +
               memory::format_bytes(s.host_bytes) + ") live in host memory, streamed through a ring of " +
               std::to_string(s.ring_slots) + " x " + memory::format_bytes(s.slot_bytes) + " on " + device_.str() +
               (swapped < config_.musubi_blocks_to_swap
                    ? " (musubi_blocks_to_swap=" + std::to_string(config_.musubi_blocks_to_swap) +
                          " clamped to the blocks less one, as SimpleTuner)"
                    : ""));
  }

  // The one checkpoint plan of the run (`auto` starts per-block; plan_checkpointing replaces it).
  const CheckpointPlan plan = config_.checkpoint_plan();
  model_->set_checkpoint_plan(plan);
  // Activation offload's host buffers (the unsloth backends and the attention offload).
  set_offload_pin_memory_max_buckets(config_.gradient_checkpointing_offload_pin_memory_max_buckets);
  if (const auto offload = config_.attention_offload()) {
    model_->set_attention_offload(offload);
    hooks_.log(std::string("[train] attention offload: every block's attention keeps what it saves for backward "
                           "in host memory, copied back ") +
               (offload->prefetch ? "one block ahead of backward" : "when backward needs it") +
               "; pinned buffers for up to " +
               std::to_string(config_.gradient_checkpointing_offload_pin_memory_max_buckets) + " tensor shapes");
  }
  if (!config_.checkpoint_layout_planned()) {
    hooks_.log("[train] gradient checkpointing: " +
               plan.describe(family_.checkpointing.stacks, model_->stack_sizes()));
  }

  trainable_ = model_->trainable_parameters();
  int64_t count = 0;
  for (const auto& [name, p] : trainable_) {
    params_.push_back(p);
    count += p.numel();
  }
  TORCH_CHECK_VALUE(!params_.empty(), "[train] the model has no trainable parameters");
  hooks_.log("[train] " + std::to_string(count) + " trainable parameters in " +
             std::to_string(params_.size()) + " tensors");
  const OptimizerSettings optimizer = optimizer_settings(config_);
  if (config_.zero_stage == 1) {
    auto zero = std::make_unique<ZeroRedundancyOptimizer>(*group_, params_, optimizer);
    zero_ = zero.get();
    const auto owned = bytes_per_rank(tensor_bytes(params_), zero->owners(), env_.world_size);
    hooks_.log("[distributed] ZeRO stage 1: this rank keeps the optimizer state of " +
               std::to_string(zero->owned_parameters().size()) + " of " + std::to_string(params_.size()) +
               " trainable tensors (" + memory::format_bytes(owned[env_.rank]) + " of " +
               memory::format_bytes(total_bytes(params_)) + " of weights)");
    optimizer_ = std::move(zero);
  } else {
    optimizer_ = make_optimizer(params_, optimizer);
  }
  hooks_.log("[train] optimizer " + optimizer.name + ": betas (" + render_number(optimizer.beta1) + ", " +
             render_number(optimizer.beta2) + "), weight decay " + render_number(optimizer.weight_decay) +
             (optimizer.name == "optimi-lion" ? std::string() : ", eps " + render_number(optimizer.epsilon)));

  step_settings_.flow = FlowMatchingOptions{config_.flow_schedule_shift, config_.flow_sigmoid_scale,
                                            config_.flow_use_uniform_schedule, config_.flux_guidance_value};
  if (config_.mixed_precision == "bf16") step_settings_.autocast = at::kBFloat16;
  step_settings_.max_grad_norm = config_.max_grad_norm;
  step_settings_.clip_by_value = config_.grad_clip_method == "value";
  step_settings_.measure_grad_norm = true;  // reported in metrics.jsonl
  step_ = std::make_unique<TrainingStep>(*model_, *optimizer_, params_, step_settings_);
  step_->add_observer(&peak_);
  start_ema();  // before the planner's profile, which counts what lives on the device
  if (config_.checkpoint_layout_planned()) plan_checkpointing();
  start_gradient_sync();  // after the profile, whose backward must not reach the reducer

  const int64_t batches_per_epoch = images_ ? images_->batches_per_epoch()
                                            : BatchSampler(data_->bucket_keys(), config_.train_batch_size).batches_per_epoch();
  total_steps_ = config_.max_train_steps > 0 ? config_.max_train_steps : steps_for_epochs(batches_per_epoch);
  schedule_ = LrSchedule{parse_lr_scheduler(config_.lr_scheduler), config_.learning_rate,
                         config_.lr_warmup_steps, std::max<int64_t>(total_steps_, 1)};

  if (resume_path) resume(*resume_path, batches_per_epoch);
  plan_epoch(position_.epoch);
}

// The average starts at the weights the run starts from (a resume replaces it with the saved one).
// Every rank keeps one; the weights, and so the averages, are equal on all of them.
void Trainer::start_ema() {
  if (!config_.use_ema) return;
  ema_ = std::make_unique<ExponentialMovingAverage>(trainable_, ema_settings(config_), device_);
  hooks_.log("[train] EMA weights: " + memory::format_bytes(ema_->bytes()) + " (float32) on " + ema_->device().str() +
             ", ema_decay " + render_number(config_.ema_decay) + ", updated every " +
             std::to_string(config_.ema_update_interval) + " step(s)" +
             (config_.ema_cpu_only ? " on the host" : ema_->device() == device_ ? "" : " on " + device_.str()));
}

void Trainer::setup_image_data() {
  const ScannedImageData scanned = scan_image_data(config_, hooks_.log);
  image_pipeline_folder(config_);  // a clear error before the caching phase starts
  data::CacheReport report;
  if (group_) {
    // Each rank encodes its share. Then rank 0 alone passes over everything: it removes what
    // interrupted runs left (no rank is writing now) and retries pictures that failed. Then the
    // others pass over everything, all current by then, for the same report and samples.
    const data::CacheShare mine{env_.rank, env_.world_size, /*remove_interrupted_writes=*/false};
    const data::CacheReport share = cache_image_data(config_, scanned, hooks_.log, hooks_.progress_is_terminal, mine);
    hooks_.log("[cache] " + env_.describe() + " encoded " + std::to_string(share.images_encoded) + " image(s) and " +
               std::to_string(share.captions_encoded) + " caption(s) of its share");
    barrier("every rank's share of the caches written");
    if (main_rank()) report = cache_image_data(config_, scanned, hooks_.log, hooks_.progress_is_terminal);
    barrier("rank 0's pass over the caches");
    const data::CacheShare reader{0, 1, /*remove_interrupted_writes=*/false};
    if (!main_rank()) report = cache_image_data(config_, scanned, hooks_.log, hooks_.progress_is_terminal, reader);
  } else {
    report = cache_image_data(config_, scanned, hooks_.log, hooks_.progress_is_terminal);
  }
  for (const auto& line : describe_cache_report(report)) hooks_.log(line);
  const auto datasets = cached_datasets(scanned, report);
  if (datasets.empty()) {
    throw ValidationError(config_.data_backend_config ? "data_backend_config" : "instance_data_dir",
                          config_.data_backend_config.value_or(config_.instance_data_dir.value_or("")),
                          "[train] no image could be encoded (see the skipped lines above)");
  }
  images_ = MultiDataset::open(datasets, report.empty_caption_path, family_.latents, config_.train_batch_size);
  hooks_.log("[train] " + std::to_string(images_->batches_per_epoch()) + " batches per epoch from " +
             std::to_string(datasets.size()) + " dataset(s)");
}

void Trainer::plan_epoch(int64_t epoch) {
  if (images_) {
    image_order_ = images_->epoch(static_cast<uint64_t>(seed_), epoch);
  } else {
    epoch_order_ = data_->epoch_batches(static_cast<uint64_t>(seed_), epoch, config_.train_batch_size);
  }
}

int64_t Trainer::epoch_length() const {
  return static_cast<int64_t>(images_ ? image_order_.size() : epoch_order_.size());
}

Batch Trainer::read_batch(int64_t i) const {
  return images_ ? images_->get_batch(image_order_[i]) : data_->get_batch(epoch_order_[i]);
}

// gradient_checkpointing_interval: auto. The profile runs on the first batch of epoch 0 (every
// batch of a run has its shape up to the bucket; the planner needs one representative) and leaves
// weights, optimizer and generators as they were, so a run with auto trains exactly as one given
// the chosen layout explicitly.
void Trainer::plan_checkpointing() {
  Batch first;
  if (images_) {
    const auto batches = images_->epoch(static_cast<uint64_t>(seed_), 0);
    TORCH_CHECK_VALUE(!batches.empty(), "[train] the dataset has no batches to profile");
    first = images_->get_batch(batches.front());
  } else {
    const auto batches = data_->epoch_batches(static_cast<uint64_t>(seed_), 0, config_.train_batch_size);
    TORCH_CHECK_VALUE(!batches.empty(), "[train] the dataset has no batches to profile");
    first = data_->get_batch(batches.front());
  }
  const Batch batch = batch_to(first, device_);
  StepProfileOptions options;
  // Accumulated gradients, and data-parallel ones (views into the reducer's buckets), live all step.
  options.gradients_persist = config_.gradient_accumulation_steps > 1 || env_.distributed();
  try {
    const AutoLayout chosen =
        apply_auto_layout(*model_, *optimizer_, params_, batch, step_settings_, noise_generator_,
                          config_.gradient_checkpointing_memory_budget, hooks_.log, options);
    // The same per-stack line a fixed interval logs.
    hooks_.log("[train] gradient checkpointing: " +
               CheckpointPlan::from_layouts(chosen.stack_layouts)
                   .describe(family_.checkpointing.stacks, model_->stack_sizes()));
  } catch (const NoLayoutFits& e) {
    const auto budget = config_.gradient_checkpointing_memory_budget;
    throw ValidationError("gradient_checkpointing_memory_budget",
                          budget ? std::to_string(*budget) : "(unset: available memory)",
                          e.what_without_backtrace());
  }
}

// The checkpoint is checked whole (validate_training_checkpoint) before anything is restored, so
// a bad one changes nothing and names the file and the field.
void Trainer::resume(const std::string& path, int64_t batches_per_epoch) {
  const TrainingCheckpoint checkpoint = load_training_checkpoint(path);
  CheckpointExpectations expected;
  for (const auto& [name, p] : trainable_) expected.trainable.emplace_back(name, p.sizes().vec());
  expected.rng = {{"noise", noise_generator_.get_state().numel()},
                  {"cpu", at::detail::getDefaultCPUGenerator().get_state().numel()}};
  // A CUDA state is restored on a CUDA run and ignored on CPU; a run may move between them.
  expected.optional_rng = {
      {"cuda", device_.is_cuda() ? at::globalContext().defaultGenerator(device_).get_state().numel() : -1}};
  expected.batches_per_epoch = batches_per_epoch;
  // Batches per step of the run that wrote it (another world size may have; Note [One run, any world size]).
  expected.gradient_accumulation_steps = batches_per_step();
  if (const auto it = checkpoint.facts.find("batches_per_step"); it != checkpoint.facts.end()) {
    try {
      expected.gradient_accumulation_steps = std::max<int64_t>(expected.gradient_accumulation_steps, std::stoll(it->second));
    } catch (const std::exception&) {
      throw ValidationError("resume_from_checkpoint", path,
                            "[train] " + path + "/state.json: facts.batches_per_step must be an integer, got '" +
                                it->second + "'");
    }
  }
  expected.optimizer_fields = optimizer_state_fields(*optimizer_);
  validate_training_checkpoint(checkpoint, path, expected);

  std::map<std::string, at::Tensor> saved(checkpoint.trainable.begin(), checkpoint.trainable.end());
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : trainable_) p.copy_(saved.at(name));
  }
  restore_optimizer_state(*optimizer_, trainable_, checkpoint.optimizer);
  restore_generators(checkpoint.rng, noise_generator_, device_);
  position_ = checkpoint.position;
  hooks_.log("[train] resumed from " + path + " at step " + std::to_string(position_.global_step));
  if (ema_ && !checkpoint.ema.empty()) {
    ema_->load_state(checkpoint.ema, checkpoint.ema_metadata);
  } else if (ema_) {
    ema_->restart();
    hooks_.log("[train] " + path + " holds no EMA weights (written without use_ema): the average starts from the "
               "resumed weights");
  } else if (!checkpoint.ema.empty()) {
    hooks_.log("[train] " + path + " holds EMA weights; this run has use_ema off and does not read them");
  }
  const auto saved_world = checkpoint.facts.find("world_size");
  if (saved_world != checkpoint.facts.end() && saved_world->second != std::to_string(env_.world_size)) {
    hooks_.log("[train] the checkpoint was written by " + saved_world->second + " process(es); this run has " +
               std::to_string(env_.world_size) + ": training continues from the same batch with a global batch of " +
               std::to_string(batches_per_step() * config_.train_batch_size) + " samples per step");
  }
}

// num_train_epochs as optimizer steps: ceil(epochs x batches per epoch / accumulation), checked
// against overflow and kMaxTrainSteps (an epoch count of 2^63 - 1 once wrapped to 0 steps and
// wrote untrained weights with exit 0).
int64_t Trainer::steps_for_epochs(int64_t batches_per_epoch) const {
  int64_t batches = 0;
  const bool overflow = __builtin_mul_overflow(config_.num_train_epochs, batches_per_epoch, &batches);
  const int64_t per_step = batches_per_step();
  const int64_t steps = overflow ? 0 : batches / per_step + (batches % per_step != 0);
  if (overflow || steps > kMaxTrainSteps) {
    throw ValidationError("num_train_epochs", std::to_string(config_.num_train_epochs),
                          "[train] num_train_epochs " + std::to_string(config_.num_train_epochs) + " x " +
                              std::to_string(batches_per_epoch) + " batches per epoch / (gradient_accumulation_steps x processes) " +
                              std::to_string(per_step) + " must be at most " +
                              std::to_string(kMaxTrainSteps) + " steps; lower num_train_epochs or set max_train_steps");
  }
  return steps;
}

std::optional<Batch> Trainer::next_batch(bool load) {
  if (position_.batch_in_epoch >= epoch_length()) {
    ++position_.epoch;
    position_.batch_in_epoch = 0;
    plan_epoch(position_.epoch);
  }
  const int64_t index = position_.batch_in_epoch++;
  if (!load) return std::nullopt;  // another rank's
  Batch batch = batch_to(read_batch(index), device_);
  batch.noise_seed = batch_noise_seed(seed_, position_.epoch, index);
  return batch;
}

// Note [Reading the loss]
// A step leaves its loss and gradient norm on the device; reading them waits for the device, so
// the trainer reads them once per logged step (every report_every steps, before a checkpoint, at
// the end), for all the steps since, and then writes their metrics lines and progress. A caller
// that watches every step (TrainerHooks::on_step) asks for a read after each one.
void Trainer::train_step(int64_t step) {
  const double lr = lr_at_step(schedule_, step - 1);
  set_learning_rate(*optimizer_, lr);
  // The step's batches of the whole run, this rank's share loaded (Note [One run, any world size]).
  std::vector<Batch> micro_batches;
  for (int64_t j = 0; j < batches_per_step(); ++j) {
    const bool mine = j % env_.world_size == env_.rank;
    if (auto batch = next_batch(mine)) micro_batches.push_back(std::move(*batch));
  }
  const auto start = std::chrono::steady_clock::now();
  PendingRecord pending;
  // A rank that dies or hangs fails the gradient all-reduce inside backward, with a message
  // naming it (GradientReducer); every other collective names itself too.
  pending.result = step_->run(micro_batches, noise_generator_);
  if (group_) {
    pending.loss_sum = group_->all_reduce_sum_async(pending.result.micro_losses, "summing the losses of step " +
                                                                                    std::to_string(step));
  }
  pending.record.step = step;
  pending.record.learning_rate = lr;
  pending.record.step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  pending.record.peak_bytes = peak_.peak_bytes();
  pending_.push_back(std::move(pending));
}

// Several processes: the loss is the mean over every rank's micro-batches (summed while the next
// steps ran); the gradient norm is every rank's (the gradients are equal); the peak is this rank's.
// Rank 0 alone writes metrics.jsonl and shows progress.
void Trainer::flush_records(TrainResult& result, MetricsWriter* metrics, ProgressReporter& progress) {
  for (auto& p : pending_) {
    if (group_) {
      const at::Tensor sum = p.loss_sum.wait().to(at::kDouble);
      p.record.loss = sum.sum().item<double>() / static_cast<double>(batches_per_step());
    } else {
      p.record.loss = p.result.loss();
    }
    p.record.grad_norm = p.result.grad_norm_value();
    if (metrics) metrics->write(p.record);
    if (main_rank()) progress.update(p.record);
    result.records.push_back(p.record);
    if (hooks_.on_step) hooks_.on_step(p.record);
    stop_if_not_finite(p.record, result);
  }
  pending_.clear();
}

// Note [Non-finite loss]
// A NaN or inf loss (or gradient norm) has already reached the weights through the optimizer
// step, so the run stops here, before anything else is written: no checkpoint or weights file
// after it, and the last checkpoint written (always after a flush that found every step finite)
// holds finite weights to resume from. Every rank computes the same loss sum, so all stop alike.
void Trainer::stop_if_not_finite(const StepRecord& record, const TrainResult& result) const {
  if (std::isfinite(record.loss) && std::isfinite(record.grad_norm)) return;
  const std::string checkpoint = result.last_checkpoint.empty()
                                     ? latest_checkpoint_text()
                                     : "the last checkpoint, " + result.last_checkpoint + ",";
  const auto text = [](double v) {
    return std::isnan(v) ? std::string("NaN") : std::isinf(v) ? std::string(v > 0 ? "inf" : "-inf") : render_number(v);
  };
  throw_value_error("[train] step " + std::to_string(record.step) + ": the loss is " + text(record.loss) +
                    " and the gradient norm " + text(record.grad_norm) +
                    ": training diverged or its inputs hold NaN/inf, so the run stops without writing anything more; " +
                    checkpoint + " holds finite weights. Lower --learning_rate (or set --max_grad_norm), check the "
                    "data, then resume with --resume_from_checkpoint=latest");
}

std::string Trainer::latest_checkpoint_text() const {
  const auto found = list_training_checkpoints(config_.output_dir);
  return found.empty() ? std::string("no checkpoint of this run was written, so none")
                       : "the last checkpoint, " + found.back() + ",";
}

// Rank 0 writes (atomically: a temporary directory renamed); the others wait at the barrier, so
// none goes on, or resumes, before the checkpoint is whole. Every rank returns its path.
std::string Trainer::save_checkpoint() {
  // ZeRO-1: every rank sends its shard of the optimizer state to rank 0 (a collective), which
  // writes the whole state: the checkpoint is that of one process, whatever the world size.
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state_now =
      zero_ ? zero_->gather_full_state(trainable_) : std::vector<std::pair<std::string, at::Tensor>>{};
  if (!main_rank()) {
    barrier("checkpoint at step " + std::to_string(position_.global_step) + " written by rank 0");
    return (fs::path(config_.output_dir) / ("checkpoint-" + std::to_string(position_.global_step))).string();
  }
  TrainingCheckpoint checkpoint;
  checkpoint.position = position_;
  for (const auto& [name, p] : trainable_) checkpoint.trainable.emplace_back(name, p.detach());
  checkpoint.optimizer = zero_ ? std::move(optimizer_state_now) : optimizer_state(*optimizer_, trainable_);
  checkpoint.rng = generator_states(noise_generator_, device_);
  if (ema_) checkpoint.ema = ema_->state(&checkpoint.ema_metadata);
  checkpoint.facts = {{"model_family", config_.model_family},
                      {"model_flavour", config_.model_flavour},
                      {"model_type", config_.model_type},
                      {"seed", std::to_string(seed_)},
                      {"world_size", std::to_string(env_.world_size)},
                      {"batches_per_step", std::to_string(batches_per_step())}};
  const std::string path = save_training_checkpoint(config_.output_dir, checkpoint);
  for (const auto& removed : prune_training_checkpoints(config_.output_dir, config_.checkpoints_total_limit)) {
    hooks_.log("[train] removed old checkpoint " + removed);
  }
  barrier("checkpoint at step " + std::to_string(position_.global_step) + " written by rank 0");
  return path;
}

// Rank 0 writes the weights (every rank holds the same) and, with use_ema, the average beside
// them (SimpleTuner's save_hooks.py: output_dir/ema/ for a LoRA; for a full fine-tune remat keeps
// both, the average in transformer_ema/ as in SimpleTuner's checkpoints); the others wait.
void Trainer::save_weights(TrainResult& result) {
  const fs::path dir(config_.output_dir);
  result.weights_path = write_weights(dir, dir / kFullWeightsFile);
  if (ema_) {
    // The average in the model's parameters while it is written (on the writing rank only).
    std::unique_ptr<ExponentialMovingAverage::Swap> average;
    if (main_rank()) average = std::make_unique<ExponentialMovingAverage::Swap>(*ema_);
    result.ema_weights_path =
        write_weights(dir / kEmaLoraFolder, dir / kEmaCheckpointFolder / fs::path(kFullWeightsFile).filename());
  }
  barrier("final weights written by rank 0");
}

std::string Trainer::write_weights(const fs::path& dir, const fs::path& full_file) {
  const fs::path final_path = config_.model_type == "lora" ? dir / kLoraWeightsFile : full_file;
  if (!main_rank()) return final_path.string();
  if (config_.model_type == "lora") {
    fs::create_directories(dir);
    std::vector<io::NamedTensor> entries;
    for (const auto& [key, tensor] : models::lora_state_dict(model_->module())) {
      entries.emplace_back(key, tensor.detach());
    }
    // diffusers' pipeline-level LoRA metadata: the PEFT LoraConfig fields, prefixed with the
    // component they belong to, as JSON under "lora_adapter_metadata".
    const nlohmann::json adapter{
        {"transformer.r", config_.lora_rank},
        {"transformer.lora_alpha", config_.lora_alpha_value()},
        {"transformer.target_modules", family_.lora_target_modules(family_.lora_target(config_))}};
    const std::map<std::string, std::string> metadata{
        {"format", "pt"},
        {"lora_rank", std::to_string(config_.lora_rank)},
        {"lora_alpha", nlohmann::json(config_.lora_alpha_value()).dump()},
        {"lora_adapter_metadata", adapter.dump()}};
    const fs::path path = dir / kLoraWeightsFile;
    if (config_.lora_format == "kohya") {
      // The same file name in kohya's layout (as SimpleTuner's comfyui format replaces diffusers').
      models::save_lora_kohya(path.string(), models::lora_state_dict(model_->module()), config_.lora_alpha_value(),
                              {{"format", "pt"}, {"lora_rank", std::to_string(config_.lora_rank)},
                               {"lora_alpha", nlohmann::json(config_.lora_alpha_value()).dump()}});
    } else {
      io::save_safetensors(path.string(), entries, metadata);
    }
    return path.string();
  }
  fs::create_directories(full_file.parent_path());
  io::save_module(full_file.string(), model_->module());
  return full_file.string();
}

// Validation between optimizer steps: the next step resets the peak it reports when it begins, so
// validation's own peak is measured here and never counted in a step's.
void Trainer::validate(int64_t step, TrainResult& result) {
  if (!validation_) {  // not rank 0: wait for its pictures
    barrier("validation at step " + std::to_string(step) + " rendered by rank 0");
    return;
  }
  render_validation(step, result);
  barrier("validation at step " + std::to_string(step) + " rendered by rank 0");
}

void Trainer::render_validation(int64_t step, TrainResult& result) {
  // Pictures are for looking at; a failed one (a full disk, say) must not end hours of training.
  // The renderer leaves the model in training mode and the generators as they were either way.
  try {
    result.validations.push_back(validation_->render(*model_, step, device_, ema_.get()));
  } catch (const c10::Error& e) {
    hooks_.log("[validation] step " + std::to_string(step) + " failed, training continues: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    hooks_.log("[validation] step " + std::to_string(step) + " failed, training continues: " + e.what());
  }
}

TrainResult Trainer::run() {
  setup();
  fs::create_directories(config_.output_dir);
  TrainResult result;
  const bool resumed = position_.global_step > 0;
  std::optional<MetricsWriter> metrics;
  if (main_rank()) metrics.emplace((fs::path(config_.output_dir) / kMetricsFile).string(), /*append=*/resumed);
  MetricsWriter* metrics_out = metrics ? &*metrics : nullptr;
  ProgressReporter progress(total_steps_, hooks_.progress_is_terminal,
                            hooks_.progress_stream ? hooks_.progress_stream : stdout,
                            config_.report_every);
  if (position_.global_step >= total_steps_) {
    hooks_.log("[train] already at step " + std::to_string(position_.global_step) + " of " +
               std::to_string(total_steps_) + "; nothing to train");
  }
  // The gallery's "before training" row, on a fresh start only (a resumed run has it already).
  if (config_.validation_requested() && !resumed && config_.validation_on_startup) validate(0, result);
  for (int64_t step = position_.global_step + 1; step <= total_steps_; ++step) {
    if (any_rank_stopping()) {
      result.interrupted = true;
      break;
    }
    train_step(step);
    if (ema_) ema_->step(step);  // SimpleTuner's order: after the optimizer step, with its global step
    position_.global_step = step;
    const bool checkpoint_now = config_.checkpoint_step_interval > 0 && step % config_.checkpoint_step_interval == 0;
    if (hooks_.on_step || checkpoint_now || step % config_.report_every == 0 || step == total_steps_) {
      flush_records(result, metrics_out, progress);
    }
    if (checkpoint_now) result.last_checkpoint = save_checkpoint();
    if (config_.validation_requested() && validation_due(config_, step)) validate(step, result);
  }
  flush_records(result, metrics_out, progress);
  progress.finish();
  if (result.interrupted) {
    result.last_checkpoint = save_checkpoint();
    hooks_.log("[train] interrupted at step " + std::to_string(position_.global_step) +
               ": saved " + result.last_checkpoint + " (resume with --resume_from_checkpoint=latest)");
  } else {
    if (result.last_checkpoint.empty() ||
        fs::path(result.last_checkpoint).filename() != "checkpoint-" + std::to_string(position_.global_step)) {
      result.last_checkpoint = save_checkpoint();
    }
    save_weights(result);
    hooks_.log("[train] wrote " + result.weights_path);
    if (!result.ema_weights_path.empty()) hooks_.log("[train] wrote the EMA weights " + result.ema_weights_path);
  }
  result.final_step = position_.global_step;
  result.summary = summarize(result.records);
  if (!result.validations.empty()) {
    // Validation's figures next to the training step's, which never include them.
    int64_t validation_peak = 0;
    double validation_seconds = 0;
    for (const auto& v : result.validations) {
      validation_peak = std::max(validation_peak, v.peak_bytes);
      validation_seconds += v.seconds;
    }
    hooks_.log("[validation] " + std::to_string(result.validations.size()) + " validation(s), " +
               render_number(validation_seconds) + "s in all; peak " + memory::format_bytes(validation_peak) +
               " (training step peak " + memory::format_bytes(result.summary.peak_bytes) + ")");
  }
  return result;
}

}  // namespace

TrainResult run_training(const TrainConfig& config, const TrainerHooks& hooks) {
  Trainer trainer(config, hooks);
  return trainer.run();
}

}  // namespace remat::train
