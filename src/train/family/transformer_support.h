#pragma once
// What the model families' adapters (families/*.cpp) share: the private helpers of
// remat::train::Transformer implementations.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "remat/io/safetensors.h"
#include "remat/train/family/flow_matching.h"
#include "remat/train/family/transformer.h"

namespace remat::train::support {

/// The sigma sampling of `options`.
SigmaSampling sampling_of(const FlowMatchingOptions& options);
/// Whether any parameter of `module` requires grad.
bool any_requires_grad(const torch::nn::Module& module);
/// The parameters of `module` that require grad.
std::vector<at::Tensor> trainable(const torch::nn::Module& module);
/// Loads `weights` strictly into `module` when given (every missing/unexpected key named).
void load_weights(torch::nn::Module& module, const std::optional<std::string>& weights, const std::string& variant = {});
/// The safetensors files of `weights`: a component folder's (one file or checked shards,
/// models::open_component_weights) or the one file; mmap'd, nothing read yet.
std::vector<io::SafetensorsFile> open_weight_files(const std::string& weights, const std::string& variant = {});
/// synthetic_batch's counts must be >= 1: throws c10::ValueError naming the first that is not.
void check_synthetic_counts(const std::string& family, int64_t batch, int64_t image_tokens,
                            int64_t text_tokens);
/// Rows of the most square rows x cols grid with rows * cols = tokens (rows <= cols).
int64_t squarest_rows(int64_t tokens);
/// Checks that `inputs` holds exactly `expected` (every name missing or unexpected is listed),
/// integer tensors for `integer_inputs` and floating ones otherwise; returns an accessor giving
/// each floating input as float32 (integer ones as they are). `inputs` must outlive it.
std::function<at::Tensor(const std::string&)> check_named_inputs(
    const std::map<std::string, at::Tensor>& inputs, const std::vector<std::string>& expected,
    const std::string& family, const std::vector<std::string>& integer_inputs = {});

}  // namespace remat::train::support
