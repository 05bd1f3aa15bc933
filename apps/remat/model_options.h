#pragma once
// The model-selection flags shared by `remat init`, `remat forward` and `remat bench`:
// --model flux|mageflow, and --preset NAME or --config config.json.

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "parse_args.h"
#include "remat/train/transformer.h"

namespace remat::cli {

struct ModelFlags {
  std::string family = "flux";
  std::string preset;
  std::string config;

  void add_to(CLI::App& app) {
    app.add_option("--model", family, "Model family")->check(CLI::IsMember({"flux", "mageflow"}))->capture_default_str();
    auto* preset_opt = app.add_option("--preset", preset,
                                      "Preset (flux: flux-dev, flux-schnell, flux-small, flux-tiny; "
                                      "mageflow: mageflow-4b, mageflow-small, mageflow-tiny)");
    auto* config_opt = app.add_option("--config", config, "A transformer config.json (diffusers format)");
    preset_opt->excludes(config_opt);
  }

  /// The transformer to build; the family's small preset when neither --preset nor --config.
  train::TransformerSpec spec() const {
    train::TransformerSpec spec;
    spec.family = family;
    spec.preset = preset.empty() ? (family == "flux" ? "flux-tiny" : "mageflow-tiny") : preset;
    if (!config.empty()) spec.config_json = config;
    return spec;
  }
};

}  // namespace remat::cli
