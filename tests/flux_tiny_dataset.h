#pragma once
// A structured latent cache shaped for flux-tiny (8x8 latents = 16 packed image tokens, 8 text
// tokens of width 32, pooled width 16, 4 captions): the data the training-loop tests train on.

#include <cstdint>
#include <string>
#include <vector>

#include "remat/train/data/data.h"
#include "remat/train/family/family.h"

namespace remat::testing {

inline remat::train::DemoDatasetOptions flux_tiny_dataset_options() {
  remat::train::DemoDatasetOptions options;
  options.sizes = {{8, 8}};  // 16 packed tokens
  options.text_tokens = 8;
  options.joint_attention_dim = 32;  // flux-tiny
  options.pooled_projection_dim = 16;
  options.num_captions = 4;
  return options;
}

/// Writes `samples` files of that cache into `dir` (make_demo_dataset, seed 7).
inline void make_flux_tiny_dataset(const std::string& dir, int64_t samples) {
  remat::train::make_demo_dataset(dir, remat::train::model_family("flux").latents, samples, 7,
                                  flux_tiny_dataset_options());
}

/// The `remat train` arguments the trainer tests start from: a rank-4 LoRA of flux-tiny on the
/// cache in `data_dir`, float32, constant learning rate 1e-2, segments of 2 blocks, seed 3, no
/// periodic checkpoints, resuming the latest checkpoint of `output_dir` when there is one.
inline std::vector<std::string> flux_tiny_lora_args(const std::string& data_dir, const std::string& output_dir) {
  return {"--model_family=flux", "--model_flavour=flux-tiny", "--model_type=lora", "--lora_rank=4",
          "--instance_data_dir=" + data_dir, "--output_dir=" + output_dir, "--train_batch_size=2",
          "--learning_rate=1e-2", "--lr_scheduler=constant", "--mixed_precision=no",
          "--gradient_checkpointing_interval=2", "--seed=3", "--checkpointing_steps=0",
          "--resume_from_checkpoint=latest"};
}

}  // namespace remat::testing
