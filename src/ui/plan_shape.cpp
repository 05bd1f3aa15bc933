#include "plan_shape.h"

#include "remat/train/family/family.h"
#include "remat/train/memory/training_plan.h"

namespace remat::ui::detail {

std::string PlanShape::description() const {
  return "batch " + std::to_string(batch) + ", " + std::to_string(image_tokens) + " image tokens, " +
         std::to_string(text_tokens) + " text tokens, " + (bf16 ? "bf16 autocast" : "float32");
}

std::string PlanShape::key() const {
  return spec.family + "|" + spec.flavour + "|" + spec.config_json.value_or("") + "|" + spec.base_precision.name +
         "|" + std::to_string(use.lora_rank) + "|" + use.lora_target + "|" + description() + "|" + std::to_string(ffn);
}

PlanShape plan_shape_of(const train::TrainConfig& config) {
  PlanShape shape;
  // The model as `remat plan` sees it: hub ids from the local cache, base_model_precision.
  bool read_model_files = true;
  shape.spec = train::planned_spec_of(config, &read_model_files);
  if (!read_model_files) {
    // A model path not on this machine (yet): pretrained_transformer_config or the flavour's
    // shapes stand in for it.
    shape.source_note = shape.spec.config_json
                            ? " (the model files named in the config were not readable here; "
                              "pretrained_transformer_config was used)"
                            : " (the model files named in the config were not readable here; the flavour's "
                              "shapes were used)";
  }
  const train::ModelFamily& family = train::model_family(config.model_family);
  shape.use.training = true;
  shape.use.base_precision = shape.spec.base_precision;
  if (config.model_type == "lora") {
    shape.use.lora_rank = config.lora_rank;
    shape.use.lora_target = family.lora_target(config);
  }
  // The run's device as the config names it ("auto": an accelerator, where the plan matters).
  shape.use.ema = train::ema_lives_on(config, config.device == "cpu" ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA));
  shape.batch = config.train_batch_size;
  shape.image_tokens = train::image_tokens_for_resolution(config);
  shape.text_tokens = config.tokenizer_max_length;
  shape.bf16 = config.mixed_precision == "bf16";
  shape.ffn = config.checkpoint_ffn_only();
  return shape;
}

}  // namespace remat::ui::detail
