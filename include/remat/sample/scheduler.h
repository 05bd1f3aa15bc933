#pragma once
/// \file
/// The flow-matching Euler sampler schedule of Flux.1: diffusers' FlowMatchEulerDiscreteScheduler
/// as FluxPipeline drives it (src/diffusers/schedulers/scheduling_flow_match_euler_discrete.py,
/// set_timesteps and step; calculate_shift in pipelines/flux/pipeline_flux.py). With dynamic
/// shifting (dev) the sigmas are
/// shifted by a resolution-dependent mu; without it (schnell) by the constant `shift`.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "remat/export.h"

namespace remat::sample {

/// The fields of a diffusers `scheduler/scheduler_config.json` that Flux sampling uses.
struct REMAT_API FlowMatchSchedulerConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;                 ///< constant shift; unused with dynamic shifting
  bool use_dynamic_shifting = false;  ///< dev: true (mu from the image sequence length)
  double base_shift = 0.5;
  double max_shift = 1.15;
  int64_t base_image_seq_len = 256;
  int64_t max_image_seq_len = 4096;
  std::string time_shift_type = "exponential";  ///< or "linear"

  /// Throws c10::ValueError naming the first invalid field (and any option diffusers has that
  /// Flux never sets, e.g. use_karras_sigmas true, which remat does not implement).
  void validate() const;
  /// Parses the JSON text of a scheduler_config.json; unknown keys are ignored, missing ones keep
  /// the defaults above.
  static FlowMatchSchedulerConfig from_json_string(const std::string& json);
  static FlowMatchSchedulerConfig from_json_file(const std::string& path);
  /// Black Forest Labs' published scheduler configs: dev (dynamic shifting, 0.5 / 1.15,
  /// 256 / 4096) and schnell (shift 1.0, no dynamic shifting).
  static FlowMatchSchedulerConfig flux_dev();
  static FlowMatchSchedulerConfig flux_schnell();
};

/// diffusers' calculate_shift: mu = image_seq_len * m + b on the line through (base_image_seq_len,
/// base_shift) and (max_image_seq_len, max_shift), in double.
REMAT_API double calculate_shift(int64_t image_seq_len, const FlowMatchSchedulerConfig& config);

/// The schedule of one sampling run.
struct FlowMatchSchedule {
  at::Tensor sigmas;     ///< float32 (N + 1), decreasing, the last one 0
  at::Tensor timesteps;  ///< float32 (N): sigmas[:N] * num_train_timesteps
  int64_t steps() const { return timesteps.size(0); }
};

/// FluxPipeline's schedule for `num_inference_steps` (>= 1) at `image_seq_len` packed image
/// tokens: input sigmas linspace(1, 1/N, N) in float64, converted to float32, shifted (dynamic:
/// e^mu / (e^mu + (1/s - 1)) evaluated in float32; linear type: mu / (mu + (1/s - 1)); constant:
/// shift s / (1 + (shift - 1) s)), then a final 0 appended. Throws c10::ValueError for N < 1 or
/// image_seq_len < 1.
REMAT_API FlowMatchSchedule flow_match_schedule(const FlowMatchSchedulerConfig& config,
                                                int64_t num_inference_steps, int64_t image_seq_len);

/// The same from given input sigmas (diffusers' set_timesteps(sigmas=...): float32 values, shifted
/// as above, a final 0 appended), as pipelines that pass their own do (SimpleTuner's MageFlowPipeline:
/// torch.linspace(1, 1/N, N) in float32). Throws c10::ValueError for no sigmas, a sigma outside
/// (0, 1], or image_seq_len < 1.
REMAT_API FlowMatchSchedule flow_match_schedule_from_sigmas(const FlowMatchSchedulerConfig& config,
                                                            const std::vector<float>& input_sigmas,
                                                            int64_t image_seq_len);

/// One Euler step (diffusers' step, deterministic): (sample.float() + (sigma[i+1] - sigma[i]) *
/// velocity) converted to velocity's dtype.
REMAT_API at::Tensor flow_match_euler_step(const at::Tensor& sample, const at::Tensor& velocity,
                                           const FlowMatchSchedule& schedule, int64_t step_index);

}  // namespace remat::sample
