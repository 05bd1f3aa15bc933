#pragma once
/// \file
/// Upper bounds on the architecture fields of a model config (Flux, MageFlow), checked by each
/// config's validate(). The published models are far inside them (flux-dev: 19 + 38 blocks,
/// width 3072, text width 4096). They exist so that a config.json saying `num_layers: 1000000000`
/// is refused with a message instead of building layers until memory runs out, and so that
/// parameter counts (parameter_count, linear_layers) cannot overflow int64: with these bounds a
/// model has at most about 3e14 parameters.

#include <cstdint>

namespace remat::models {

/// Blocks per stack (num_layers, num_single_layers, depth).
inline constexpr int64_t kMaxConfigBlocks = 1024;
/// Widths: hidden size (heads x head dim), channels, text and pooled widths.
inline constexpr int64_t kMaxConfigWidth = 65536;
/// patch_size.
inline constexpr int64_t kMaxConfigPatchSize = 64;

}  // namespace remat::models
