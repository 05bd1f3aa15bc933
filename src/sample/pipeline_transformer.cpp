// The transformer of a sampling run: built in its dtype from the pipeline folder's
// transformer/config.json, loaded in either weight layout, LoRAs merged (remat/sample/pipeline.h).

#include <filesystem>

#include <torch/torch.h>

#include "remat/default_dtype.h"
#include "remat/encoders/flux_transformer_weights.h"
#include "remat/error.h"
#include "remat/sample/pipeline.h"

namespace remat::sample {

models::Flux load_transformer_with_loras(const std::string& transformer_dir, at::ScalarType dtype, c10::Device device,
                                         const std::vector<models::LoraFile>& loras,
                                         const std::vector<LoraSpec>& specs,
                                         const models::BasePrecision& precision) {
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    throw_value_error(std::string("[sample] dtype must be float32 or bfloat16, got ") + c10::toString(dtype));
  }
  if (loras.size() != specs.size()) {
    throw_value_error("[sample] " + std::to_string(loras.size()) + " LoRA files but " +
                      std::to_string(specs.size()) + " LoRA scales");
  }
  const auto config =
      models::FluxConfig::from_json_file((std::filesystem::path(transformer_dir) / "config.json").string());
  models::Flux model{nullptr};
  {
    DefaultDtypeGuard guard(dtype);
    if (precision.mode == models::WeightQuantization::none) {
      model = models::Flux(config);
    } else {
      // The block Linears wait without weights and are quantised as the file streams by.
      {
        models::DeferLinearWeights defer;
        model = models::Flux(config);
      }
      models::resolve_deferred_linears(*model, precision);
    }
  }
  encoders::load_flux_transformer_weights(*model, transformer_dir);
  // Merged on the CPU, in float32 per module and rounded once to the weights' dtype.
  for (size_t i = 0; i < loras.size(); ++i) models::merge_lora(*model, loras[i], specs[i].scale);
  model->to(device);
  model->eval();
  return model;
}

}  // namespace remat::sample
