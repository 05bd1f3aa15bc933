#pragma once
// Constants Flux.1 and MageFlow share, and the linear-layer list that mirrors both
// (diffusers transformer_flux.py: Timesteps(num_channels=256), mlp_ratio 4.0, rope theta 10000).

#include <cstdint>

namespace remat::models {

inline constexpr double kRopeTheta = 10000.0;
inline constexpr int64_t kTimeChannels = 256;
inline constexpr int64_t kMlpRatio = 4;

}  // namespace remat::models
