// FlowMatchSchedulerConfig and the Flux sampling schedule: diffusers'
// FlowMatchEulerDiscreteScheduler.set_timesteps / step (schedulers/
// scheduling_flow_match_euler_discrete.py) as FluxPipeline calls them.
//
// Note [Schedule precision]
// diffusers computes the input sigmas in float64 (numpy linspace), converts them to float32, and
// then shifts them with numpy float32 arithmetic: a Python float (exp(mu), mu, shift) meeting a
// float32 array is rounded to float32 first. The shift below therefore works on float values
// one operation at a time, in the same order, so the float32 sigmas match diffusers' bits
// (a float64 evaluation differs in the 8th digit; tests/sample/scheduler_test.cpp checks the
// float32 bits of a recorded FluxPipeline run).

#include "remat/sample/scheduler.h"

#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "config_json.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"

namespace remat::sample {
namespace {

constexpr const char* kComponent = "scheduler";
using Json = nlohmann::json;

[[noreturn]] void fail(const std::string& origin, const std::string& what) {
  throw_value_error(std::string("[scheduler] ") + origin + ": " + what);
}

// The keys of diffusers' FlowMatchEulerDiscreteScheduler.__init__ that remat implements
// (Note [Config fields] in config_json.h); validate() checks their values, time_shift_type's
// included ("exponential" or "linear").
constexpr auto flow_match_scheduler_fields = [](auto& c, auto&& field) {
  field("num_train_timesteps", c.num_train_timesteps);
  field("shift", c.shift);
  field("use_dynamic_shifting", c.use_dynamic_shifting);
  field("base_shift", c.base_shift);
  field("max_shift", c.max_shift);
  field("base_image_seq_len", c.base_image_seq_len);
  field("max_image_seq_len", c.max_image_seq_len);
  field("time_shift_type", c.time_shift_type);
};

// Options of diffusers' scheduler that change the schedule and that no Flux config sets: remat
// does not implement them, so a config that turns one on is refused rather than sampled wrongly.
void reject_unsupported(const Json& j, const remat::detail::ConfigFieldReader& field, const std::string& origin) {
  for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas",
                          "stochastic_sampling", "use_flow_sigmas"}) {
    bool on = false;
    field(key, on);
    if (on) {
      fail(origin, std::string("config key '") + key +
                       "' is true; remat implements Flux's schedule only (dynamic or constant shift), where it "
                       "is false");
    }
  }
  auto it = j.find("shift_terminal");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_number()) {
      fail(origin, "config key 'shift_terminal' must be a number or null, got " + util::json_excerpt(*it));
    }
    if (it->get<double>() != 0.0) {
      fail(origin, "config key 'shift_terminal' is " + util::json_excerpt(*it) +
                       "; remat implements Flux's schedule only, where it is null");
    }
  }
}

FlowMatchSchedulerConfig parse(const std::string& text, const std::string& origin) {
  const Json j = remat::detail::parse_config_json(text, kComponent);
  FlowMatchSchedulerConfig c;
  const remat::detail::ConfigFieldReader field(j, "[scheduler] " + origin + ": ");
  flow_match_scheduler_fields(c, field);
  reject_unsupported(j, field, origin);
  try {
    c.validate();
  } catch (const c10::ValueError& e) {
    fail(origin, e.what_without_backtrace());
  }
  return c;
}

// numpy.linspace(1, 1/N, N) in float64: start + i * step, the last element exactly the stop.
std::vector<double> input_sigmas(int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  const double start = 1.0, stop = 1.0 / static_cast<double>(n);
  const double step = n > 1 ? (stop - start) / static_cast<double>(n - 1) : 0.0;
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<double>(i) * step + start;
  if (n > 1) out.back() = stop;
  return out;
}

// One shifted sigma, in float32 as numpy evaluates it (Note [Schedule precision]).
float shift_sigma(float s, const FlowMatchSchedulerConfig& config, double mu) {
  if (config.use_dynamic_shifting) {
    const float odds = 1.0f / s - 1.0f;  // (1/t - 1) ** 1.0
    if (config.time_shift_type == "linear") {
      const float m = static_cast<float>(mu);
      return m / (m + odds);
    }
    const float e = static_cast<float>(std::exp(mu));
    return e / (e + odds);
  }
  const float shift = static_cast<float>(config.shift);
  const float shift_minus_one = static_cast<float>(config.shift - 1.0);
  return shift * s / (1.0f + shift_minus_one * s);
}

}  // namespace

void FlowMatchSchedulerConfig::validate() const {
  auto bad = [](const std::string& what) { throw_value_error("[scheduler] " + what); };
  if (num_train_timesteps < 1) bad("num_train_timesteps must be >= 1, got " + std::to_string(num_train_timesteps));
  if (!std::isfinite(shift) || shift <= 0.0) bad("shift must be a finite number > 0, got " + std::to_string(shift));
  if (!std::isfinite(base_shift) || !std::isfinite(max_shift)) {
    bad("base_shift and max_shift must be finite, got " + std::to_string(base_shift) + " and " +
        std::to_string(max_shift));
  }
  if (base_image_seq_len < 1 || max_image_seq_len < 1 || base_image_seq_len == max_image_seq_len) {
    bad("base_image_seq_len and max_image_seq_len must be >= 1 and differ (they define the line mu is read "
        "from), got " + std::to_string(base_image_seq_len) + " and " + std::to_string(max_image_seq_len));
  }
  if (time_shift_type != "exponential" && time_shift_type != "linear") {
    bad("time_shift_type must be \"exponential\" or \"linear\", got \"" + util::text_excerpt(time_shift_type) + "\"");
  }
}

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::from_json_string(const std::string& json) {
  return parse(json, "config JSON");
}

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::from_json_file(const std::string& path) {
  return remat::detail::parse_config_file(path, kComponent,
                                          [&](const std::string& text) { return parse(text, "'" + path + "'"); });
}

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::flux_dev() {
  FlowMatchSchedulerConfig c;
  c.shift = 3.0;  // in the published file; unused with dynamic shifting
  c.use_dynamic_shifting = true;
  return c;
}

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::flux_schnell() {
  FlowMatchSchedulerConfig c;
  c.shift = 1.0;
  c.use_dynamic_shifting = false;
  return c;
}

double calculate_shift(int64_t image_seq_len, const FlowMatchSchedulerConfig& config) {
  const double m = (config.max_shift - config.base_shift) /
                   static_cast<double>(config.max_image_seq_len - config.base_image_seq_len);
  const double b = config.base_shift - m * static_cast<double>(config.base_image_seq_len);
  return static_cast<double>(image_seq_len) * m + b;
}

FlowMatchSchedule flow_match_schedule(const FlowMatchSchedulerConfig& config, int64_t num_inference_steps,
                                      int64_t image_seq_len) {
  if (num_inference_steps < 1) {
    throw_value_error("[scheduler] num_inference_steps must be >= 1, got " + std::to_string(num_inference_steps));
  }
  std::vector<float> inputs;
  for (const double s : input_sigmas(num_inference_steps)) inputs.push_back(static_cast<float>(s));
  return flow_match_schedule_from_sigmas(config, inputs, image_seq_len);
}

FlowMatchSchedule flow_match_schedule_from_sigmas(const FlowMatchSchedulerConfig& config,
                                                  const std::vector<float>& inputs, int64_t image_seq_len) {
  config.validate();
  if (inputs.empty()) throw_value_error("[scheduler] a schedule needs at least one sigma");
  for (const float s : inputs) {
    if (!(s > 0.0f && s <= 1.0f)) {
      throw_value_error("[scheduler] input sigmas must be in (0, 1], got " + std::to_string(s));
    }
  }
  if (image_seq_len < 1) {
    throw_value_error("[scheduler] image_seq_len must be >= 1, got " + std::to_string(image_seq_len));
  }
  const double mu = calculate_shift(image_seq_len, config);
  const auto steps = static_cast<int64_t>(inputs.size());
  FlowMatchSchedule schedule;
  schedule.sigmas = at::zeros({steps + 1}, at::kFloat);
  schedule.timesteps = at::empty({steps}, at::kFloat);
  float* sigmas = schedule.sigmas.data_ptr<float>();
  float* timesteps = schedule.timesteps.data_ptr<float>();
  const float train_steps = static_cast<float>(config.num_train_timesteps);
  for (int64_t i = 0; i < steps; ++i) {
    sigmas[i] = shift_sigma(inputs[static_cast<size_t>(i)], config, mu);
    timesteps[i] = sigmas[i] * train_steps;
  }
  return schedule;
}

at::Tensor flow_match_euler_step(const at::Tensor& sample, const at::Tensor& velocity,
                                 const FlowMatchSchedule& schedule, int64_t step_index) {
  if (step_index < 0 || step_index >= schedule.steps()) {
    throw_value_error("[scheduler] step_index must be in [0, " + std::to_string(schedule.steps()) + "), got " +
                      std::to_string(step_index));
  }
  if (!sample.sizes().equals(velocity.sizes())) {
    TORCH_CHECK_VALUE(false, "[scheduler] sample ", sample.sizes(), " and velocity ", velocity.sizes(),
                      " must have the same shape");
  }
  // dt is a 0-dim float32 tensor: by PyTorch's promotion rules dt * velocity stays in velocity's
  // dtype (rounded there for bfloat16), and the sum with the float32 sample is float32
  // (FlowMatchEulerDiscreteScheduler.step).
  const at::Tensor sigmas = schedule.sigmas.to(velocity.device());
  const at::Tensor dt = sigmas[step_index + 1] - sigmas[step_index];
  return (sample.to(at::kFloat) + dt * velocity).to(velocity.scalar_type());
}

}  // namespace remat::sample
