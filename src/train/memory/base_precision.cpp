// base_model_precision's vocabulary and rules (remat/train/memory/base_precision.h). The names and their
// labels follow SimpleTuner (helpers/training/__init__.py quantised_precision_levels and the
// field registry's _quant_label in simpletuner_sdk/.../sections/model.py); which of them remat
// implements is decided in one place, models::parse_base_model_precision.
#include "remat/train/memory/base_precision.h"

#include <algorithm>

#include <c10/util/Exception.h>
#include <torch/version.h>

#include "remat/train/options/options.h"

namespace remat::train {
namespace {

bool supported(const std::string& name) {
  const auto names = models::supported_base_model_precisions();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string supported_list() {
  std::string out;
  for (const auto& name : models::supported_base_model_precisions()) {
    if (name == "no_change") continue;
    out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

// What each SimpleTuner name computes, for the refusal of the ones remat lacks.
const std::map<std::string, std::string>& what_each_needs() {
  static const std::map<std::string, std::string> needs = {
      {"int8-quanto", "int8 weights with per-channel scales"},
      {"int4-quanto", "4-bit integer weights with group scales (optimum-quanto qint4)"},
      {"int2-quanto", "2-bit integer weights (optimum-quanto qint2)"},
      {"int8-torchao", "int8 weights with per-channel scales"},
      {"int8dq-torchao", "int8 quantisation of the activations at run time (TorchAO), not weight-only"},
      {"int8dq-int4-torchao", "int8 activations quantised at run time with int4 weights (TorchAO)"},
      {"int8-sdnq", "SDNQ's int8 weights (SD.Next's quantiser)"},
      {"uint8-sdnq", "SDNQ's uint8 weights (SD.Next's quantiser)"},
      {"int16-sdnq", "SDNQ's int16 weights (SD.Next's quantiser)"},
      {"uint16-sdnq", "SDNQ's uint16 weights (SD.Next's quantiser)"},
      {"fp16-sdnq", "SDNQ's fp16 weights (SD.Next's quantiser)"},
      {"fp8-sdnq", "SDNQ's fp8 weights with fp8 matmul (SD.Next's quantiser)"},
      {"int6-sdnq", "SDNQ's 6-bit weights (SD.Next's quantiser)"},
      {"int5-sdnq", "SDNQ's 5-bit weights (SD.Next's quantiser)"},
      {"uint5-sdnq", "SDNQ's unsigned 5-bit weights (SD.Next's quantiser)"},
      {"uint4-sdnq", "SDNQ's unsigned 4-bit weights (SD.Next's quantiser)"},
      {"uint3-sdnq", "SDNQ's unsigned 3-bit weights (SD.Next's quantiser)"},
      {"uint2-sdnq", "SDNQ's unsigned 2-bit weights (SD.Next's quantiser)"},
      {"nf4-bnb", "4-bit NormalFloat weights"},
      {"int4-torchao", "4-bit integer weights with group scales (TorchAO int4_weight_only)"},
      {"fp8-quanto", "float8 e4m3 weights with per-channel scales"},
      {"fp8uz-quanto", "float8 e4m3fnuz weights (the AMD variant, optimum-quanto)"},
      {"fp8-native", "fp8 activations and weights in a scaled fp8 matmul"},
      {"fp8-torchao", "fp8 quantisation of the activations at run time (TorchAO), not weight-only"},
      {"fp8wo-torchao", "float8 e4m3 weights with per-channel scales"},
      {"fp8-int4-torchao", "fp8 activations quantised at run time with int4 weights (TorchAO)"},
      {"fp8-transformerengine", "NVIDIA TransformerEngine's fp8 layers"},
  };
  return needs;
}

// SimpleTuner's _quant_label.
std::string simpletuner_label(const std::string& value) {
  static const std::map<std::string, std::string> special = {
      {"no_change", "No Change"},
      {"int8dq-torchao", "INT8 dynamic activations (TorchAO)"},
      {"int8dq-int4-torchao", "INT8 dynamic activations + INT4 weights (TorchAO)"},
      {"fp8-native", "FP8 native scaled matmul"},
      {"fp8-torchao", "FP8 dynamic activations (TorchAO)"},
      {"fp8wo-torchao", "FP8 weight-only (TorchAO)"},
      {"fp8-int4-torchao", "FP8 dynamic activations + INT4 weights (TorchAO)"},
      {"fp8-sdnq", "FP8 native matmul (SDNQ)"}};
  const auto it = special.find(value);
  if (it != special.end()) return it->second;
  const auto dash = value.find('-');
  std::string prefix = value.substr(0, dash);
  std::transform(prefix.begin(), prefix.end(), prefix.begin(), [](unsigned char c) { return std::toupper(c); });
  const std::string suffix = value.substr(dash + 1);
  const std::string backend = suffix == "quanto" ? "Quanto" : suffix == "bnb" ? "BitsAndBytes"
                              : suffix == "torchao" ? "TorchAO" : suffix == "sdnq" ? "Sdnq" : suffix;
  return prefix + " (" + backend + ")";
}

}  // namespace

const std::vector<std::string>& simpletuner_base_model_precisions() {
  static const std::vector<std::string> names = {
      "no_change",  "int8-quanto", "int4-quanto",  "int2-quanto",  "int8-torchao", "int8dq-torchao",
      "int8dq-int4-torchao", "int8-sdnq", "uint8-sdnq", "int16-sdnq", "uint16-sdnq", "fp16-sdnq",
      "fp8-sdnq",   "int6-sdnq",   "int5-sdnq",    "uint5-sdnq",   "uint4-sdnq",   "uint3-sdnq",
      "uint2-sdnq", "nf4-bnb",     "int4-torchao", "fp8-quanto",   "fp8uz-quanto", "fp8-native",
      "fp8-torchao", "fp8wo-torchao", "fp8-int4-torchao", "fp8-transformerengine"};
  return names;
}

std::map<std::string, std::string> base_model_precision_labels() {
  std::map<std::string, std::string> labels;
  for (const auto& name : simpletuner_base_model_precisions()) {
    std::string label = simpletuner_label(name);
    if (name != "no_change" && supported(name)) {
      // The same text on every build (the docs are generated from it): a supported name that
      // does not parse here is an fp8 one without float8 dtypes.
      try {
        const models::BasePrecision p = models::parse_base_model_precision(name);
        label += ", remat: " + models::to_string(p.mode) + (p.double_quantization ? " (double-quantised scales)" : "") +
                 (p.mode == models::WeightQuantization::fp8 ? " (LibTorch 2.1+)" : "");
      } catch (const c10::ValueError&) {
        label += ", remat: fp8 (LibTorch 2.1+)";
      }
    } else if (name != "no_change") {
      label += ", not in remat";
    }
    labels[name] = label;
  }
  return labels;
}

std::map<std::string, std::string> unsupported_base_model_precisions() {
  std::map<std::string, std::string> out;
  const std::string remat_has = " (remat quantises with " + supported_list() + ")";
  for (const auto& name : simpletuner_base_model_precisions()) {
    if (supported(name)) continue;
    const auto needs = what_each_needs().find(name);
    out[name] = (needs != what_each_needs().end() ? needs->second : "SimpleTuner's " + name + " quantisation") + remat_has;
  }
  return out;
}

std::optional<std::string> base_model_precision_unavailable(const std::string& name) {
  if (!supported(name)) return std::nullopt;
  try {
    models::parse_base_model_precision(name);  // throws for fp8 without float8 dtypes
  } catch (const c10::Error& e) {
    if (!models::float8_supported()) {
      return "float8 dtypes, which LibTorch has from 2.1 (this build has " + std::string(TORCH_VERSION) +
             "; int8-quanto quantises to 8 bits without them)";
    }
    return std::string(e.what_without_backtrace());
  }
  return std::nullopt;
}

std::vector<Diagnostic> base_model_precision_diagnostics(const TrainConfig& config) {
  std::vector<Diagnostic> out;
  // A name remat refuses anyway is reported once, as unsupported.
  if (!supported(config.base_model_precision) || base_model_precision_unavailable(config.base_model_precision)) return out;
  if (config.base_model_precision != "no_change" && config.model_type != "lora") {
    out.push_back({Diagnostic::Severity::Error, "base_model_precision", config.base_model_precision,
                   "[train] base_model_precision=" + config.base_model_precision +
                       " quantises the frozen base weights, which only LoRA training has: model_type=" +
                       config.model_type +
                       " trains those weights themselves. Use model_type=lora with it (as SimpleTuner "
                       "does), or base_model_precision=no_change for a full fine-tune"});
  }
  return out;
}

models::BasePrecision parse_base_model_precision_option(const std::string& text, const std::string& command) {
  const OptionSpec& spec = *find_option("base_model_precision");
  const std::string tag = "[" + command + "] ";
  std::string name;
  try {
    name = std::get<std::string>(parse_option_value(spec, text));
  } catch (const ValidationError& e) {
    // The registry's sentence ("[train] base_model_precision must be one of ..."), under the
    // command's tag.
    const std::string train_tag = "[train] ";
    std::string message = e.message();
    if (message.rfind(train_tag, 0) == 0) message = tag + message.substr(train_tag.size());
    throw ValidationError(e.option(), e.value(), message);
  }
  if (const auto needs = spec.unsupported_values.find(name); needs != spec.unsupported_values.end()) {
    throw ValidationError(spec.name, name,
                          tag + "base_model_precision " + name + " is not supported by remat: it needs " + needs->second);
  }
  if (spec.unavailable_value) {
    if (const auto lacks = spec.unavailable_value(name)) {
      throw ValidationError(spec.name, name, tag + "base_model_precision " + name + " needs " + *lacks);
    }
  }
  return models::parse_base_model_precision(name);
}

models::BasePrecision base_precision_of(const TrainConfig& config) {
  return models::parse_base_model_precision(config.base_model_precision.empty() ? "no_change"
                                                                                : config.base_model_precision);
}

}  // namespace remat::train
