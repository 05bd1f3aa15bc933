#pragma once
/// \file
/// Any registered model family's text-to-image parts (remat/sample/pipeline.h TextToImage), made
/// from its descriptor (remat/train/family/family.h) alone: its encoders, its transformer built the one
/// way (make_transformer) with LoRAs merged, its scheduler and its Transformer's denoiser.
/// `remat sample` and validation images sample through these.

#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "remat/export.h"
#include "remat/sample/pipeline.h"
#include "remat/train/family/family.h"
#include "remat/train/family/transformer.h"

namespace remat::train {

/// A family's TextToImage, which also samples with a transformer already built.
class REMAT_API FamilyPipeline : public sample::TextToImage {
 public:
  /// The family's denoising loop on `transformer` (validation: the live training model, as it
  /// is) with this pipeline's scheduler; `transformer` must outlive the Denoiser.
  virtual std::unique_ptr<sample::Denoiser> denoiser_for(Transformer& transformer) const = 0;
};

/// The registered family whose pipelines `folder` holds: model_index.json's `_class_name` among
/// the families' pipeline_classes. Throws c10::ValueError naming the folder, its class and the
/// classes remat samples.
REMAT_API const ModelFamily& family_of_pipeline(const std::string& folder);

/// `family`'s TextToImage over the pipeline folder `folder` (opened with the family's encoder
/// components and checked with its check_pipeline). Its transformer is `transformer` when given
/// (validation: the run's own), else the folder's transformer/ component. The folder's
/// scheduler/ samples; a folder without one samples with the published scheduler of `flavour`,
/// and must have one when `flavour` is empty. Every component's weights are read in `variant`
/// (models::find_component_weights) when it is given. Throws c10::ValueError for a family that does
/// not sample or a folder without its components.
REMAT_API std::unique_ptr<FamilyPipeline> make_text_to_image(const ModelFamily& family, const std::string& folder,
                                                             const std::string& flavour = "",
                                                             const TransformerSpec* transformer = nullptr,
                                                             const std::string& variant = {});

/// Builds `spec`'s transformer on the CPU (make_transformer: in spec.dtype, its base quantised as
/// spec.base_precision says), merges `loras` with the scales of `specs`, in order
/// (models::merge_lora: in float32 per module, rounded once to the weights' dtype; into a
/// quantised layer's dequantised weight, quantised again), and puts it in eval mode. What
/// TextToImage::load_denoiser samples with.
REMAT_API std::unique_ptr<Transformer> load_transformer_with_loras(const TransformerSpec& spec,
                                                                   const std::vector<models::LoraFile>& loras,
                                                                   const std::vector<sample::LoraSpec>& specs);

/// sample::run_pipeline with the TextToImage of options.folder's family.
REMAT_API std::vector<at::Tensor> run_text_to_image(const sample::PipelineOptions& options,
                                                    const std::vector<sample::SampleRequest>& requests,
                                                    const sample::PipelineEvents& events = {});

}  // namespace remat::train
