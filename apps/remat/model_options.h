#pragma once
// The model-selection flags shared by `remat init`, `remat forward` and `remat bench`, named as
// `remat train` names them: --model_family, --model_flavour, --pretrained_transformer_config.

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "parse_args.h"
#include "remat/train/family/family.h"
#include "remat/train/family/transformer.h"

namespace remat::cli {

struct ModelFlags {
  std::string family = train::model_family_names().front();
  std::string flavour;
  std::string config;

  void add_to(CLI::App& app) {
    app.add_option("--model_family", family, "Model family")
        ->check(CLI::IsMember(train::model_family_names()))
        ->capture_default_str();
    std::string presets;
    for (const auto* f : train::model_families()) {
      std::string names;
      for (const auto& n : f->flavours) names += (names.empty() ? "" : ", ") + n;
      presets += (presets.empty() ? "" : "; ") + f->name + ": " + names;
    }
    auto* flavour_opt = app.add_option("--model_flavour", flavour,
                                       "Preset (" + presets + "); default: the family's small one");
    auto* config_opt = app.add_option("--pretrained_transformer_config", config,
                                      "A transformer config.json (diffusers format)");
    flavour_opt->excludes(config_opt);
  }

  /// The transformer to build; the family's small preset when neither flavour nor config.
  train::TransformerSpec spec() const {
    train::TransformerSpec spec;
    spec.family = family;
    spec.flavour = flavour.empty() ? train::model_family(family).small_flavour : flavour;
    if (!config.empty()) spec.config_json = config;
    return spec;
  }
};

}  // namespace remat::cli
