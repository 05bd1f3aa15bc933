#include "remat/ui/step_profile.h"

#include <istream>
#include <iterator>
#include <new>
#include <ostream>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "config_values.h"
#include "plan_shape.h"
#include "remat/util/bounded_json.h"
#include "remat/train/memory/auto_layout.h"
#include "remat/train/optimizers/optimizer.h"
#include "remat/train/run/step.h"
#include "remat/train/family/transformer.h"
#include "step_model_json.h"

namespace remat::ui {
namespace {

// One training step of `config` on the CPU, as `interval: auto` profiles it at the start of a run:
// float32 weights (the trainer's), bf16 under autocast when mixed_precision is bf16.
train::StepModel profile(const train::TrainConfig& config, const detail::PlanShape& shape) {
  const c10::Device cpu(c10::kCPU);
  auto transformer = train::make_transformer(shape.spec, cpu);
  if (shape.use.lora_rank > 0) {
    transformer->apply_lora(shape.use.lora_target, shape.use.lora_rank, config.lora_alpha_value());
  }
  transformer->module().train();
  std::vector<at::Tensor> params;
  for (const auto& named : transformer->trainable_parameters()) params.push_back(named.second);
  const auto optimizer = train::make_optimizer(params, train::optimizer_settings(config));
  at::Generator generator = at::detail::createCPUGenerator(0);
  const train::Batch example =
      transformer->synthetic_batch(shape.batch, shape.image_tokens, shape.text_tokens, generator, cpu);
  train::StepSettings settings;
  if (shape.bf16) settings.autocast = at::kBFloat16;
  train::StepProfileOptions options;
  options.ffn = shape.ffn;
  return train::profile_step(*transformer, *optimizer, params, example, settings, generator, options);
}

// An allocation refused under the memory limit: LibTorch's CPU allocator reports it as a
// c10::Error (1.13: "DefaultCPUAllocator: can't allocate memory ..."), later releases as
// c10::OutOfMemoryError; the standard library as std::bad_alloc.
bool is_allocation_failure(const c10::Error& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  const std::string text = e.what_without_backtrace();
  return text.find("can't allocate memory") != std::string::npos ||
         text.find("not enough memory") != std::string::npos;
}

void answer_error(std::ostream& out, const std::string& message, bool out_of_memory) {
  out << nlohmann::json{{"error", message}, {"out_of_memory", out_of_memory}}.dump(
             -1, ' ', false, nlohmann::json::error_handler_t::replace)
      << "\n";
}

}  // namespace

int run_step_profile_child(std::istream& in, std::ostream& out) {
  try {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    util::check_json_text(text, util::kMaxJsonFileBytes, "[ui] step profile request");
    const nlohmann::json request = nlohmann::json::parse(text);
    const train::ValidationReport report = train::validate_option_values(detail::config_values(request));
    if (!report.ok()) {
      answer_error(out, "[ui] the config has errors: " + report.errors().front().message, false);
      return 1;
    }
    const detail::PlanShape shape = detail::plan_shape_of(report.config);
    const train::StepModel model = profile(report.config, shape);
    out << nlohmann::json{{"step_model", detail::step_model_json(model)}}.dump() << "\n";
    out.flush();
    return 0;
  } catch (const std::bad_alloc&) {
    answer_error(out, "[ui] out of memory", true);
  } catch (const c10::Error& e) {
    // The allocator's own text is not for the page; the server words the refusal.
    const bool memory = is_allocation_failure(e);
    answer_error(out, memory ? "[ui] out of memory" : e.what_without_backtrace(), memory);
  } catch (const std::exception& e) {
    answer_error(out, e.what(), false);
  }
  out.flush();
  return 1;
}

}  // namespace remat::ui
