// Checking a training checkpoint before anything resumes from it: state.json typed and ranged
// field by field, and every tensor file holding exactly what this run needs, by name and shape.
// A checkpoint is a directory anyone can edit; before these checks a negative batch_in_epoch
// indexed a vector out of bounds, and an epoch of 1.5, an empty optimizer file or a renamed RNG
// entry resumed silently and inexactly.
#include <charconv>
#include <limits>
#include <set>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "string_helpers.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"
#include "remat/train/options/config.h"
#include "remat/train/run/ema.h"
#include "remat/train/run/training_state.h"

namespace remat::train {
namespace {

using remat::detail::shape_text;


// An integer field of state.json in [0, high]: not a float (1.5, 1e30), not a boolean, and not
// past int64 (nlohmann keeps such integers unsigned).
int64_t read_count(const nlohmann::json& state, const std::string& path, const char* field, int64_t high) {
  const auto it = state.find(field);
  TORCH_CHECK_VALUE(it != state.end(), "[checkpoint] '", path, "': field ", field, " is missing");
  const nlohmann::json& v = *it;
  const bool fits = v.is_number_integer() &&
                    (v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(high)
                                            : v.get<int64_t>() >= 0 && v.get<int64_t>() <= high);
  TORCH_CHECK_VALUE(fits, "[checkpoint] '", path, "': ", field, " must be an integer in [0, ", high, "], got ",
                    util::json_excerpt(v));
  return v.get<int64_t>();
}

}  // namespace

TrainingPosition read_training_position(const std::string& state_path, std::map<std::string, std::string>* facts) {
  // Note [Bounded JSON]: a regular file of bounded size and depth.
  const std::string text = util::read_regular_file(state_path, util::kMaxJsonFileBytes, "checkpoint", "state file");
  util::check_json_text(text, util::kMaxJsonFileBytes, "[checkpoint] '" + state_path + "'");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, "[checkpoint] '", state_path, "' is not a valid state file: ",
                      util::json_error_excerpt(e));
  }
  TORCH_CHECK_VALUE(state.is_object(), "[checkpoint] '", state_path, "' must hold a JSON object, got a ",
                    state.type_name());
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  TrainingPosition position;
  position.global_step = read_count(state, state_path, "global_step", kMaxTrainSteps);
  // Ranged against the run in validate_training_checkpoint; here only typed.
  position.epoch = read_count(state, state_path, "epoch", kMax);
  position.batch_in_epoch = read_count(state, state_path, "batch_in_epoch", kMax);
  std::map<std::string, std::string> read_facts;
  const auto it = state.find("facts");
  if (it != state.end()) {
    TORCH_CHECK_VALUE(it->is_object(), "[checkpoint] '", state_path, "': facts must be an object of strings, got ",
                      util::json_excerpt(*it));
    for (const auto& [key, value] : it->items()) {
      TORCH_CHECK_VALUE(value.is_string(), "[checkpoint] '", state_path, "': facts.", util::text_excerpt(key),
                        " must be a string, got ", util::json_excerpt(value));
      read_facts[key] = value.get<std::string>();
    }
  }
  if (facts) *facts = std::move(read_facts);
  return position;
}

void validate_training_checkpoint(const TrainingCheckpoint& checkpoint, const std::string& path,
                                  const CheckpointExpectations& expected) {
  const TrainingPosition& p = checkpoint.position;
  const std::string state = "[checkpoint] '" + path + "/state.json': ";
  // The data position: within this dataset's epoch (next_batch indexes the epoch's batches with
  // it), and no more epochs than batches consumed (each epoch has at least one batch).
  TORCH_CHECK_VALUE(p.batch_in_epoch <= expected.batches_per_epoch, state, "batch_in_epoch must be in [0, ",
                    expected.batches_per_epoch, "] (batches per epoch of this dataset), got ", p.batch_in_epoch);
  int64_t batches = 0;
  const bool overflow = __builtin_mul_overflow(p.global_step, expected.gradient_accumulation_steps, &batches);
  TORCH_CHECK_VALUE(!overflow && p.epoch <= batches, state, "epoch must be in [0, ", overflow ? 0 : batches,
                    "] (global_step ", p.global_step, " x gradient_accumulation_steps ",
                    expected.gradient_accumulation_steps, " batches consumed), got ", p.epoch);

  // Each file holds exactly the expected names: a missing or renamed tensor is named, and so is
  // an extra one (a renamed entry shows as both).
  const auto check_names = [&](const std::vector<io::NamedTensor>& tensors, const std::string& file,
                               const std::map<std::string, at::Tensor>& by_name,
                               const std::set<std::string>& required, const std::set<std::string>& allowed) {
    for (const auto& name : required) {
      TORCH_CHECK_VALUE(by_name.count(name), "[checkpoint] '", path, "/", file, "' has no tensor '", name, "' (",
                        tensors.size(), " tensors in the file); resume with the same model_family, flavour, "
                        "model_type and LoRA settings");
    }
    for (const auto& [name, tensor] : tensors) {
      TORCH_CHECK_VALUE(allowed.count(name), "[checkpoint] '", path, "/", file, "' holds '", util::text_excerpt(name),
                        "', which this run does not have");
    }
  };
  const auto expect_shape = [&](const at::Tensor& t, at::IntArrayRef shape, const std::string& file,
                                const std::string& name) {
    TORCH_CHECK_VALUE(t.sizes() == shape, "[checkpoint] '", path, "/", file, "': '", name, "' has shape ",
                      shape_text(t.sizes()), ", expected ", shape_text(shape));
  };

  // trainable.safetensors: every trainable tensor, floating, of its parameter's shape.
  std::map<std::string, at::Tensor> trainable(checkpoint.trainable.begin(), checkpoint.trainable.end());
  std::set<std::string> names;
  for (const auto& [name, shape] : expected.trainable) names.insert(name);
  check_names(checkpoint.trainable, "trainable.safetensors", trainable, names, names);
  for (const auto& [name, shape] : expected.trainable) {
    expect_shape(trainable.at(name), shape, "trainable.safetensors", name);
    TORCH_CHECK_VALUE(at::isFloatingType(trainable.at(name).scalar_type()), "[checkpoint] '", path,
                      "/trainable.safetensors': '", name, "' must be floating point, got ",
                      trainable.at(name).scalar_type());
  }

  // optimizer.safetensors: after a step, the optimizer's state of every trainable tensor
  // (optimizer_state); before any, none.
  std::map<std::string, at::Tensor> optimizer(checkpoint.optimizer.begin(), checkpoint.optimizer.end());
  std::set<std::string> moments;
  if (p.global_step > 0) {
    for (const auto& [name, shape] : expected.trainable) {
      for (const auto& field : expected.optimizer_fields) moments.insert(name + "." + field);
    }
  }
  check_names(checkpoint.optimizer, "optimizer.safetensors", optimizer, moments, moments);
  for (const auto& [name, shape] : expected.trainable) {
    if (p.global_step == 0) break;
    for (const auto& field : expected.optimizer_fields) {
      const at::Tensor& t = optimizer.at(name + "." + field);
      if (t.dim() > 0) expect_shape(t, shape, "optimizer.safetensors", name + "." + field);
    }
    const auto step_entry = optimizer.find(name + ".step");
    if (step_entry == optimizer.end() || step_entry->second.scalar_type() != at::kLong) continue;
    const at::Tensor& step = step_entry->second;
    TORCH_CHECK_VALUE(step.dim() == 0, "[checkpoint] '", path, "/optimizer.safetensors': '", name,
                      ".step' must be an int64 scalar, got shape ", shape_text(step.sizes()));
    const int64_t count = step.item<int64_t>();
    TORCH_CHECK_VALUE(count >= 1 && count <= p.global_step, "[checkpoint] '", path, "/optimizer.safetensors': '",
                      name, ".step' must be in [1, ", p.global_step, "] (global_step), got ", count);
  }

  // transformer_ema/ema_model.safetensors, when present: exactly the trainable tensors, float32,
  // of their shapes, and an optimization_step in [0, global_step].
  if (!checkpoint.ema.empty()) {
    const std::string file = std::string(kEmaCheckpointFolder) + "/" + kEmaCheckpointFile;
    std::map<std::string, at::Tensor> ema(checkpoint.ema.begin(), checkpoint.ema.end());
    check_names(checkpoint.ema, file, ema, names, names);
    for (const auto& [name, shape] : expected.trainable) {
      expect_shape(ema.at(name), shape, file, name);
      TORCH_CHECK_VALUE(ema.at(name).scalar_type() == at::kFloat, "[checkpoint] '", path, "/", file, "': '", name,
                        "' must be float32, got ", ema.at(name).scalar_type());
    }
    const auto step = checkpoint.ema_metadata.find("optimization_step");
    int64_t value = -1;
    if (step != checkpoint.ema_metadata.end()) {
      const std::string& text = step->second;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (error != std::errc() || end != text.data() + text.size()) value = -1;
    }
    TORCH_CHECK_VALUE(value >= 0 && value <= p.global_step, "[checkpoint] '", path, "/", file,
                      "': metadata optimization_step must be an integer in [0, ", p.global_step, "] (global_step), got ",
                      step == checkpoint.ema_metadata.end() ? std::string("none")
                                                            : "'" + util::text_excerpt(step->second) + "'");
  }

  // rng.safetensors: the generators by name, each a uint8 state of its generator's size.
  std::map<std::string, at::Tensor> rng(checkpoint.rng.begin(), checkpoint.rng.end());
  std::set<std::string> required, allowed;
  for (const auto& [name, bytes] : expected.rng) required.insert(name), allowed.insert(name);
  for (const auto& [name, bytes] : expected.optional_rng) allowed.insert(name);
  check_names(checkpoint.rng, "rng.safetensors", rng, required, allowed);
  for (const auto& [name, state] : rng) {
    auto it = expected.rng.find(name);
    const int64_t bytes = it != expected.rng.end() ? it->second : expected.optional_rng.at(name);
    TORCH_CHECK_VALUE(state.scalar_type() == at::kByte && state.dim() == 1 && (bytes < 0 || state.numel() == bytes),
                      "[checkpoint] '", path, "/rng.safetensors': generator state '", name, "' must be U8 of shape [",
                      bytes < 0 ? std::string("n") : std::to_string(bytes), "], got ", state.scalar_type(), " of shape ",
                      shape_text(state.sizes()));
  }
}

}  // namespace remat::train
