// Writes what a parity check of the CLIP text encoder and tokenizer against another
// implementation needs, all from remat:
//
//   clip_dump <out_dir> <captions.txt>
//
// out_dir/tokenizer/              write_tiny_clip_tokenizer's files
// out_dir/tokens.json             per caption (one per line of captions.txt): ids, attention_mask,
//                                 removed_text
// out_dir/<name>/config.json      two fp32 models with random weights (seed 0): "tiny" (its own
// out_dir/<name>/model.safetensors  vocabulary, eos-id pooling) and "tiny_legacy" (vocab 49408 and
// out_dir/<name>/outputs.safetensors  eos_token_id 2, ids framed by 49406/49407: the legacy argmax
//                                 pooling FLUX.1 takes); input_ids, last_hidden_state, pooled_output
// out_dir/<name>/outputs_bf16.safetensors  the same model cast to bf16: last_hidden_state, pooled_output
//
// The other side loads the same weights and ids and compares its outputs with outputs.safetensors.

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/encoders/clip_text_model.h"
#include "remat/encoders/clip_tokenizer.h"
#include "remat/io/safetensors.h"

namespace {

using namespace remat;
namespace fs = std::filesystem;

void dump_model(const fs::path& dir, const encoders::ClipTextConfig& config, const at::Tensor& ids) {
  fs::create_directories(dir);
  torch::manual_seed(0);
  encoders::ClipTextModel model(config);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.normal_(0.0, 0.2);
  }
  std::ofstream(dir / "config.json") << config.to_json();
  io::save_module((dir / "model.safetensors").string(), *model);
  torch::NoGradGuard no_grad;
  const auto out = model->forward(ids);
  io::save_safetensors((dir / "outputs.safetensors").string(),
                       {{"input_ids", ids}, {"last_hidden_state", out.last_hidden_state}, {"pooled_output", out.pooled_output}});
  // The same weights rounded to bf16 (Tensor::to), run in bf16.
  model->to(at::kBFloat16);
  const auto out16 = model->forward(ids);
  io::save_safetensors((dir / "outputs_bf16.safetensors").string(),
                       {{"last_hidden_state", out16.last_hidden_state}, {"pooled_output", out16.pooled_output}});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: clip_dump <out_dir> <captions.txt>\n";
    return 2;
  }
  const fs::path out = argv[1];
  std::ifstream in(argv[2]);
  std::vector<std::string> captions;
  for (std::string line; std::getline(in, line);) captions.push_back(line);

  encoders::write_tiny_clip_tokenizer((out / "tokenizer").string());
  const auto tokenizer = encoders::ClipTokenizer::from_directory((out / "tokenizer").string());
  nlohmann::json tokens = nlohmann::json::array();
  std::vector<int64_t> flat;
  for (const auto& c : captions) {
    const auto enc = tokenizer.encode(c);
    tokens.push_back({{"caption", c}, {"ids", enc.ids}, {"attention_mask", enc.attention_mask},
                      {"removed_text", enc.removed_text}, {"truncation_message", enc.truncation_message()}});
    flat.insert(flat.end(), enc.ids.begin(), enc.ids.end());
  }
  std::ofstream(out / "tokens.json") << tokens.dump(1) << "\n";

  const auto ids = torch::tensor(flat, at::kLong).view({static_cast<int64_t>(captions.size()), 77});
  dump_model(out / "tiny", encoders::ClipTextConfig::tiny(), ids);

  auto legacy = encoders::ClipTextConfig::tiny();
  legacy.vocab_size = 49408;
  legacy.bos_token_id = 0;
  legacy.eos_token_id = 2;
  legacy.pad_token_id = 1;
  // The tiny vocabulary's specials (730, 731) moved to CLIP's ids.
  const auto framed = ids.masked_fill(ids == tokenizer.bos_id(), 49406).masked_fill(ids == tokenizer.eos_id(), 49407);
  dump_model(out / "tiny_legacy", legacy, framed);
  std::cout << "wrote " << captions.size() << " captions to " << out << "\n";
  return 0;
}
