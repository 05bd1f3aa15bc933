#include "plan_figures.h"

#include <cmath>

#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>

#include "remat/layout.h"
#include "remat/plan.h"
#include "remat/train/admission.h"
#include "remat/train/family.h"
#include "remat/train/model_source.h"
#include "remat/train/optimizer.h"
#include "remat/train/step.h"
#include "remat/train/transformer.h"

namespace remat::ui::detail {
namespace {

// Flux and MageFlow: 8x VAE downsampling, then 2x2 packing: one image token per 16x16 pixels.
// `resolution` is a side in pixels, or megapixels when below 16 (SimpleTuner's area mode).
int64_t image_tokens_of(const train::TrainConfig& config) {
  const double side = config.resolution < 16 ? std::sqrt(config.resolution * 1e6) : config.resolution;
  const int64_t per_side = std::max<int64_t>(1, static_cast<int64_t>(std::lround(side / 16)));
  return per_side * per_side;
}

}  // namespace

nlohmann::json PlanCache::figures(const train::TrainConfig& config, std::optional<int64_t> budget_bytes) {
  train::TransformerSpec spec;
  spec.family = config.model_family;
  spec.preset = config.model_flavour;
  std::string source_note;
  try {
    spec.config_json = train::resolve_model_source(config).config_json;
  } catch (const std::exception& e) {
    // A model path not on this machine (yet): the flavour's shapes stand in for it.
    source_note = " (the model files named in the config were not readable here; the flavour's shapes were used)";
  }
  const train::ModelFamily& family = train::model_family(config.model_family);
  train::ModelUse use;
  use.training = true;
  if (config.model_type == "lora") {
    use.lora_rank = config.lora_rank;
    use.lora_target = family.lora_target(config);
  }
  const int64_t batch = config.train_batch_size;
  const int64_t image_tokens = image_tokens_of(config);
  const int64_t text_tokens = config.tokenizer_max_length;
  const bool bf16 = config.mixed_precision == "bf16";
  const std::string shape = "batch " + std::to_string(batch) + ", " + std::to_string(image_tokens) +
                            " image tokens, " + std::to_string(text_tokens) + " text tokens, " +
                            (bf16 ? "bf16 autocast" : "float32");
  nlohmann::json out;
  const std::optional<train::MemoryDemand> demand = train::predict_model_memory(spec, use);
  if (demand) {
    out["model_bytes"] = {{"weights", demand->weight_bytes},
                          {"gradients", demand->gradient_bytes},
                          {"optimizer", demand->optimizer_bytes}};
  }
  if (!demand || demand->total() > kMaxProfiledModelBytes) {
    out["basis"] = "memory model only: no step profile for " + config.model_flavour +
                   " is available on this machine (profiling it needs the model in memory). The peak "
                   "below counts weights, gradients and optimizer state, not activations; the "
                   "step-time factor and what auto picks need a profile (run `remat bench` on the "
                   "training machine)." + source_note;
    out["profile_available"] = false;
    out["predicted_peak_bytes"] = demand ? nlohmann::json(demand->total()) : nlohmann::json();
    out["step_time_factor"] = nullptr;
    out["auto"] = nullptr;
    return out;
  }

  const std::string key = config.model_family + "|" + config.model_flavour + "|" + spec.config_json.value_or("") +
                          "|" + config.model_type + "|" + std::to_string(use.lora_rank) + "|" + use.lora_target +
                          "|" + shape + "|" + std::to_string(config.checkpoint_ffn_only());
  std::shared_ptr<const train::StepModel> model;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = models_.find(key);
  if (it != models_.end()) {
    model = it->second;
  } else {
    const c10::Device cpu(c10::kCPU);
    auto transformer = train::make_transformer(spec, cpu);
    if (bf16) transformer->module().to(at::kBFloat16);
    if (use.lora_rank > 0) transformer->apply_lora(use.lora_target, use.lora_rank, config.lora_alpha_value());
    transformer->module().train();
    std::vector<at::Tensor> params;
    for (const auto& named : transformer->trainable_parameters()) params.push_back(named.second);
    const auto optimizer = train::make_optimizer(params, train::optimizer_settings(config));
    at::Generator generator = at::detail::createCPUGenerator(0);
    const train::Batch example = transformer->synthetic_batch(batch, image_tokens, text_tokens, generator, cpu);
    train::StepSettings settings;
    if (bf16) settings.autocast = at::kBFloat16;
    train::StepProfileOptions options;
    options.ffn = config.checkpoint_ffn_only();
    model = std::make_shared<const train::StepModel>(
        train::profile_step(*transformer, *optimizer, params, example, settings, generator, options));
    models_[key] = model;
  }

  // The config's own layout, over every block of the stacks.
  const CheckpointPlan plan = config.gradient_checkpointing ? config.checkpoint_plan() : CheckpointPlan::off();
  std::vector<Layout> stacks;
  for (size_t s = 0; s < model->stack_sizes.size(); ++s) stacks.push_back(plan.layout_for(s, model->stack_sizes[s]));
  const Layout keep_all = layout_keep_all(model->chain.num_blocks());
  const Prediction baseline = predict(model->chain, keep_all);
  const bool ffn = config.gradient_checkpointing && config.checkpoint_ffn_only() && model->ffn_chain;
  // CheckpointPlan::layout_for reads interval and stride only: "off" is every block kept.
  const Layout layout = (ffn || !config.gradient_checkpointing) ? keep_all : train::join_stack_layouts(stacks);
  const Prediction chosen = predict(ffn ? *model->ffn_chain : model->chain, layout);
  out["basis"] = "cost model from a profile of one training step of " + config.model_flavour + " (" + shape +
                 ") measured on this server's CPU; peaks count the same tensors on a GPU, times are "
                 "relative to no checkpointing." + source_note;
  out["profile_available"] = true;
  out["layout"] = ffn ? "ffn (feed-forward parts checkpointed in every block)" : describe_layout(layout);
  out["interval_auto"] = config.gradient_checkpointing_interval_auto;
  out["predicted_peak_bytes"] = chosen.peak_bytes;
  out["predicted_step_s"] = chosen.step_s;
  out["step_time_factor"] = baseline.step_s > 0 ? chosen.step_s / baseline.step_s : 1.0;
  out["no_checkpointing_peak_bytes"] = baseline.peak_bytes;

  const int64_t budget = budget_bytes ? *budget_bytes
                                      : config.gradient_checkpointing_memory_budget.value_or(
                                            train::default_memory_budget(c10::Device(c10::kCPU)));
  const PlanResult pick = plan_layout(model->chain, budget);
  out["auto"] = {{"budget_bytes", budget},
                 {"layout", describe_layout(pick.layout)},
                 {"fits", pick.fits},
                 {"predicted_peak_bytes", pick.prediction.peak_bytes},
                 {"step_time_factor", baseline.step_s > 0 ? pick.prediction.step_s / baseline.step_s : 1.0},
                 {"min_possible_peak_bytes", pick.min_possible_peak},
                 {"explanation", pick.explanation}};
  return out;
}

}  // namespace remat::ui::detail
