#pragma once
/// \file
/// MageFlow's text conditioning as SimpleTuner makes it (simpletuner/helpers/models/mageflow/
/// pipeline.py, MageFlowPipeline.encode_prompt, with PROMPT_TEMPLATE of vendor/models/utils.py):
/// the prompt put in Mage-Flow's chat template, tokenized by Qwen3-VL's tokenizer (truncated to
/// max_sequence_length plus the template's prefix), run through Qwen3-VL's language model, and the
/// final-normed last hidden state kept from the template's start index on (34 tokens dropped for
/// text-to-image, 64 for the edit flavours' template). One prompt at a time, unpadded.
/// The `text_encoder/` folder of a MageFlow pipeline holds all of it: config.json (Qwen3-VL's),
/// the weights and tokenizer.json (SimpleTuner's tokenizer_subfolder is text_encoder).

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "remat/encoders/qwen2_tokenizer.h"
#include "remat/encoders/qwen3_text_model.h"
#include "remat/export.h"

namespace remat::encoders {

/// One of PROMPT_TEMPLATE's entries: the text around the prompt ("{}" marks it) and how many
/// leading tokens of the encoded template are dropped.
struct MageFlowPromptTemplate {
  std::string name;    ///< "mage-flow" or "mage-flow-edit"
  std::string format;  ///< with one "{}"
  int64_t start_idx = 0;
  /// The format with `prompt` in place of "{}" (Python's str.format with one argument).
  std::string apply(const std::string& prompt) const;
};

/// "mage-flow" (text to image, start_idx 34) or, with `edit`, "mage-flow-edit" (start_idx 64).
REMAT_API const MageFlowPromptTemplate& mageflow_prompt_template(bool edit);

/// SimpleTuner's default tokenizer_max_length for MageFlow (mageflow/model.py check_user_config).
inline constexpr int64_t kMageFlowMaxSequenceLength = 2048;

class REMAT_API MageFlowTextEncoder {
 public:
  /// Reads `text_encoder_dir`: config.json (Qwen3TextConfig::from_json_file), tokenizer.json
  /// (Qwen2Tokenizer) and the weights (models::open_component_weights with `variant`), the model
  /// built directly in `dtype` (float32 or bfloat16) on `device`.
  static MageFlowTextEncoder load(const std::string& text_encoder_dir, at::ScalarType dtype,
                                  const at::Device& device = at::kCPU, const std::string& variant = {});
  MageFlowTextEncoder(Qwen2Tokenizer tokenizer, Qwen3TextModel model);

  /// The ids the model reads for `prompt`: the template applied, tokenized, cut to
  /// max_sequence_length + start_idx tokens (the tokenizer's truncation keeps the first ones).
  std::vector<int64_t> template_ids(const std::string& prompt, int64_t max_sequence_length, bool edit) const;
  /// prompt_embeds (L, hidden_size) in the model's dtype on the CPU: the final-normed hidden state
  /// from position start_idx on. Throws c10::ValueError when max_sequence_length is below 1 or the
  /// templated prompt has no token past start_idx.
  at::Tensor encode(const std::string& prompt, int64_t max_sequence_length = kMageFlowMaxSequenceLength,
                    bool edit = false) const;

  const Qwen2Tokenizer& tokenizer() const { return tokenizer_; }
  Qwen3TextModel& model() { return model_; }

 private:
  Qwen2Tokenizer tokenizer_;
  Qwen3TextModel model_;
};

}  // namespace remat::encoders
