#include "remat/train/family/hub_models.h"

#include <filesystem>
#include <optional>

#include <c10/util/Exception.h>

#include "remat/encoders/pipeline_folder.h"
#include "remat/io/hub_cache.h"
#include "remat/train/family/family.h"
#include "remat/util/error.h"

namespace remat::train {
namespace {

namespace fs = std::filesystem;

std::string resolved_line(const std::string& option, const io::HubSnapshot& s) {
  return "[train] " + option + ": " + s.repo_id + " at revision " + s.revision + " (commit " + s.commit +
         ") from the Hugging Face cache: " + s.directory;
}

// The snapshot holds what training reads from pretrained_model_name_or_path: a pipeline folder
// (with a transformer unless an override supplies it) or a transformer folder. A failure names
// the hub id, the revision and the command that fetches the rest.
void check_model_snapshot(const io::HubSnapshot& s, const encoders::PipelineLayout& layout, bool needs_transformer,
                          const std::string& variant) {
  const std::string context = " (pretrained_model_name_or_path " + s.repo_id + " at revision " + s.revision +
                              ", snapshot " + s.directory + "; remat does not download: fetch the missing files with `" +
                              io::hub_download_command(s.repo_id, s.revision) + "`)";
  try {
    if (encoders::is_pipeline_folder(s.directory)) {
      encoders::PipelineFolder::open(s.directory,
                                     needs_transformer ? std::vector<std::string>{"transformer"} : std::vector<std::string>{},
                                     {}, layout, variant);
    } else if (encoders::is_component_folder(s.directory)) {
      encoders::resolve_component_directory(s.directory, "transformer", std::nullopt, layout, variant);
    } else {
      throw_value_error("[train] the snapshot holds neither model_index.json (a diffusers pipeline) nor config.json "
                        "(a transformer folder)");
    }
  } catch (const c10::ValueError& e) {
    throw_value_error(std::string(e.what_without_backtrace()) + context);
  }
}

}  // namespace

std::vector<std::string> resolve_hub_models(TrainConfig& config) {
  std::vector<std::string> log;
  const std::string revision = config.revision.value_or("main");
  const ModelFamily& family = model_family(config.model_family);
  auto& model = config.pretrained_model_name_or_path;

  // The model itself: "random", the flavour's id, or an id the user gave.
  std::string flavour_note;
  std::error_code ec;
  if (model == std::optional<std::string>(kRandomWeights) && !fs::exists(kRandomWeights, ec)) {
    model.reset();  // validation already warned that the transformer starts from random weights
  } else if (!model && !config.pretrained_transformer_model_name_or_path) {
    const FlavourSpec* flavour = family.flavour(config.model_flavour);
    if (flavour != nullptr && !flavour->hub_id.empty()) {
      model = flavour->hub_id;
      flavour_note = " (model_flavour " + config.model_flavour + " without pretrained_model_name_or_path means " +
                     flavour->hub_id + ", as SimpleTuner maps it; give a local path or another id, or " +
                     "pretrained_model_name_or_path=" + kRandomWeights + " to start from random weights)";
    }
  }
  if (model) {
    try {
      if (const auto s = io::hub_snapshot_unless_local(*model, revision, {}, "train")) {
        check_model_snapshot(*s, family.encoders.layout, !config.pretrained_transformer_model_name_or_path,
                             config.variant.value_or(""));
        log.push_back(resolved_line("pretrained_model_name_or_path", *s));
        model = s->directory;
      }
    } catch (const c10::ValueError& e) {
      throw_value_error(std::string(e.what_without_backtrace()) + flavour_note);
    }
  }

  auto& transformer = config.pretrained_transformer_model_name_or_path;
  if (transformer) {
    // Its subfolder and contents are checked with the other sources (resolve_model_source).
    if (const auto s = io::hub_snapshot_unless_local(*transformer, revision, {}, "train")) {
      log.push_back(resolved_line("pretrained_transformer_model_name_or_path", *s));
      transformer = s->directory;
    }
  }

  auto& vae = config.pretrained_vae_model_name_or_path;
  if (vae) {
    try {
      if (const auto s = io::hub_snapshot_unless_local(*vae, revision, {}, "train")) {
        log.push_back(resolved_line("pretrained_vae_model_name_or_path", *s));
        vae = s->directory;
      }
    } catch (const c10::ValueError& e) {
      // Training reads latents from the cache: the VAE is checked when present, never required.
      log.push_back("[train] pretrained_vae_model_name_or_path not resolved, not needed for training: " +
                    std::string(e.what_without_backtrace()));
    }
  }
  return log;
}

}  // namespace remat::train
