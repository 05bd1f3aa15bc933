#pragma once
// A structured latent cache shaped for flux-tiny (8x8 latents = 16 packed image tokens, 8 text
// tokens of width 32, pooled width 16, 4 captions): the data the training-loop tests train on.

#include <cstdint>
#include <string>

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

}  // namespace remat::testing
