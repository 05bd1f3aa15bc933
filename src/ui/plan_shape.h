#pragma once
// What POST /api/plan profiles for a config: the model and the batch shapes of one training
// step. The server keys its step models by it and sizes the profile with it; the child process
// that profiles (step_profile.cpp) builds the same model and batch from it.

#include <cstdint>
#include <string>

#include "remat/train/memory/admission.h"
#include "remat/train/options/config.h"
#include "remat/train/family/transformer.h"

namespace remat::ui::detail {

struct PlanShape {
  train::TransformerSpec spec;
  /// Training, and LoRA's rank and target when the config trains LoRA.
  train::ModelUse use;
  int64_t batch = 0;
  int64_t image_tokens = 0;
  int64_t text_tokens = 0;
  bool bf16 = false;
  /// Also profile the blocks with only their feed-forward part checkpointed (the "-ffn" backends).
  bool ffn = false;
  /// Set when the model files the config names could not be read here (the flavour's shapes
  /// stand in for them), for the answer's basis.
  std::string source_note;

  /// "batch 4, 4096 image tokens, 512 text tokens, float32".
  std::string description() const;
  /// Equal for configs whose step profiles are the same.
  std::string key() const;
};

/// The shape of one training step of `config` (validated).
PlanShape plan_shape_of(const train::TrainConfig& config);

}  // namespace remat::ui::detail
