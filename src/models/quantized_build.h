#pragma once
// Building a model with quantised base Linears without ever holding its full-precision weights
// (remat/models/quantized_loading.h): the family's model files instantiate it with their loader.

#include <vector>

#include "remat/io/safetensors.h"
#include "remat/models/quantization.h"

namespace remat::models {

// Model(config) built with its Linears deferred, the ones `precision` picks made waiting for a
// quantised weight, then either loaded from `files` with `load(module, files)` (which quantises
// each waiting weight as it streams by) or, without files, randomly initialised one at a time.
template <typename Model, typename Config, typename Load>
Model make_quantized_model(const Config& config, const BasePrecision& precision,
                     const std::vector<io::SafetensorsFile>* files, Load load) {
  Model model{nullptr};
  {
    DeferLinearWeights defer;
    model = Model(config);
  }
  resolve_deferred_linears(*model, precision);
  if (files != nullptr) {
    load(*model, *files);
  } else {
    initialize_awaiting_linears(*model);
  }
  return model;
}

}  // namespace remat::models
