#pragma once
/// \file
/// Building Flux / MageFlow with quantised base weights without ever holding the full-precision
/// model: the Linears are built without weights (DeferLinearWeights), the quantised ones wait
/// (resolve_deferred_linears), and each waiting weight is quantised as it streams from the mmap'd
/// safetensors file (or is initialised randomly), one tensor at a time. Peak: the quantised model
/// plus one full-precision tensor (tests/models/quantized_loading_test.cpp measures it).

#include <vector>

#include "remat/export.h"
#include "remat/io/safetensors.h"
#include "remat/models/flux.h"
#include "remat/models/mageflow.h"
#include "remat/models/quantization.h"

namespace remat::models {

/// Strict diffusers-layout load (io::load_state_dict_into's checks: every missing, unexpected
/// or misshaped key is an error and nothing changes) into a module whose waiting Linears
/// (LinearImpl::awaits_weight) are quantised from the mapping, one at a time. Without waiting
/// Linears it is io::load_state_dict_into.
REMAT_API void load_state_dict_quantizing(torch::nn::Module& module, const std::vector<io::SafetensorsFile>& files);

/// A Flux model built in the default dtype with its quantisable Linears (is_quantized_linear_name)
/// quantised to `precision`: loaded from `files` (either layout, models::load_flux_weights) when
/// given, else initialised as the constructors do. precision none: the plain model (loaded when
/// files are given).
REMAT_API Flux make_quantized_flux(const FluxConfig& config, const BasePrecision& precision,
                                   const std::vector<io::SafetensorsFile>* files = nullptr);
/// The same for MageFlow (diffusers layout, load_state_dict_quantizing).
REMAT_API MageFlow make_quantized_mageflow(const MageFlowConfig& config, const BasePrecision& precision,
                                           const std::vector<io::SafetensorsFile>* files = nullptr);

}  // namespace remat::models
