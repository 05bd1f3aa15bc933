// MageFlow's text conditioning (remat/encoders/mageflow_text_encoder.h), after SimpleTuner's
// MageFlowPipeline.encode_prompt (simpletuner/helpers/models/mageflow/pipeline.py at bc8e6ab7) and
// PROMPT_TEMPLATE (vendor/models/utils.py).
#include "remat/encoders/mageflow_text_encoder.h"

#include <filesystem>

#include <torch/torch.h>

#include "remat/models/component_weights.h"
#include "remat/util/error.h"

namespace remat::encoders {

std::string MageFlowPromptTemplate::apply(const std::string& prompt) const {
  const size_t at = format.find("{}");
  return format.substr(0, at) + prompt + format.substr(at + 2);
}

const MageFlowPromptTemplate& mageflow_prompt_template(bool edit) {
  static const MageFlowPromptTemplate text_to_image{
      "mage-flow",
      "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
      "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
      "<|im_start|>assistant\n",
      34};
  static const MageFlowPromptTemplate editing{
      "mage-flow-edit",
      "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
      "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
      "image that meets the user's requirements while maintaining consistency with the original input where "
      "appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
      64};
  return edit ? editing : text_to_image;
}

MageFlowTextEncoder::MageFlowTextEncoder(Qwen2Tokenizer tokenizer, Qwen3TextModel model)
    : tokenizer_(std::move(tokenizer)), model_(std::move(model)) {}

MageFlowTextEncoder MageFlowTextEncoder::load(const std::string& dir, at::ScalarType dtype, const at::Device& device,
                                              const std::string& variant) {
  const std::filesystem::path root(dir);
  const auto config = Qwen3TextConfig::from_json_file((root / "config.json").string());
  Qwen2Tokenizer tokenizer = Qwen2Tokenizer::from_file((root / "tokenizer.json").string());
  // A tokenizer whose ids the model cannot embed, or without the chat template's markers, would
  // fail deep inside the first forward or encode something else than the template.
  if (tokenizer.vocab_size() > config.vocab_size) {
    throw_value_error("[mageflow] '" + (root / "tokenizer.json").string() + "' has " +
                      std::to_string(tokenizer.vocab_size()) + " tokens but config.json's vocab_size is " +
                      std::to_string(config.vocab_size) + "; the two come from different models");
  }
  for (const char* marker : {"<|im_start|>", "<|im_end|>"}) {
    if (!tokenizer.token_id(marker)) {
      throw_value_error("[mageflow] '" + (root / "tokenizer.json").string() + "' has no " + marker +
                        " token: it is not Qwen3-VL's tokenizer, whose chat template MageFlow's prompts use");
    }
  }
  Qwen3TextModel model = load_qwen3_text_model(models::open_component_weights(dir, variant), config, dtype);
  model->to(device);
  return MageFlowTextEncoder(std::move(tokenizer), std::move(model));
}

std::vector<int64_t> MageFlowTextEncoder::template_ids(const std::string& prompt, int64_t max_sequence_length,
                                                       bool edit) const {
  if (max_sequence_length < 1) {
    throw_value_error("[mageflow] tokenizer_max_length must be at least 1, got " + std::to_string(max_sequence_length));
  }
  const MageFlowPromptTemplate& t = mageflow_prompt_template(edit);
  std::vector<int64_t> ids = tokenizer_.encode(t.apply(prompt));
  // encode_prompt: truncation=True, max_length=max_sequence_length + drop_idx (the right end cut).
  const auto limit = static_cast<size_t>(max_sequence_length + t.start_idx);
  if (ids.size() > limit) ids.resize(limit);
  return ids;
}

at::Tensor MageFlowTextEncoder::encode(const std::string& prompt, int64_t max_sequence_length, bool edit) const {
  const std::vector<int64_t> ids = template_ids(prompt, max_sequence_length, edit);
  const int64_t start = mageflow_prompt_template(edit).start_idx;
  if (static_cast<int64_t>(ids.size()) <= start) {
    throw_value_error("[mageflow] the templated prompt has " + std::to_string(ids.size()) +
                      " tokens, not more than the template's start index " + std::to_string(start) +
                      " (a tokenizer of another model?)");
  }
  torch::NoGradGuard no_grad;
  Qwen3TextModel model = model_;  // a holder of the same module: forward is not const
  const at::Tensor input = torch::tensor(ids, at::kLong).unsqueeze(0).to(model->embed_tokens->weight.device());
  const at::Tensor hidden = model->forward(input)[0];
  return hidden.narrow(0, start, hidden.size(0) - start).to(at::kCPU).contiguous();
}

}  // namespace remat::encoders
