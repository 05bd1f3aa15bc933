// write_demo_qwen2_tokenizer: a small Qwen2 tokenizer.json whose merges are learned here by BPE from
// a built-in corpus, in the tokenizers library's format and with the pipeline transformers'
// Qwen2Tokenizer builds, so every code path of the real tokenizer runs on it (multi-byte
// characters included: the corpus has accents, CJK and emoji, so their bytes merge).

#include <algorithm>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "clip_text_normalize.h"
#include "remat/encoders/qwen2_tokenizer.h"
#include "remat/util/files.h"

namespace remat::encoders {
namespace {

constexpr int kDemoMerges = 300;

// Captions of the kind the demo pipeline draws, and a few in other scripts.
constexpr const char* kCorpus[] = {
    "a red square on a blue background",
    "a green circle on a white background",
    "a yellow triangle on a black background",
    "two red squares and a blue circle",
    "a photo of a cat sitting on a wooden table",
    "a painting of a mountain landscape at sunset",
    "an illustration of the city at night with bright lights",
    "the background is black and the circle is white",
    "It's a café in the old town; they're open until 22:00.",
    "Ein großer Bär läuft über die Straße",
    "un château près de la forêt, été 2024",
    "一只红色的猫坐在桌子上",
    "青い空と白い雲",
    "빨간 사각형",
    "a smiling face 😀 and a red heart ❤️",
    "You are an assistant that describes images in detail.",
    "Describe the image by detailing the color, shape, size, texture, quantity, text and spatial relationships.",
};

using Word = std::vector<std::string>;

std::string symbols_of_byte(unsigned char b) {
  return detail::code_points_to_utf8(std::u32string(1, detail::byte_symbols()[b]));
}

}  // namespace

void write_demo_qwen2_tokenizer(const std::string& dir) {
  util::make_directories(dir, "qwen2", "the tokenizer folder");
  // Words of the corpus, as the pre-tokenizer cuts them, in byte symbols, with their counts.
  std::map<Word, int64_t> words;
  for (const char* line : kCorpus) {
    for (const auto& piece : qwen2_pre_tokenize(line)) {
      ++words[detail::word_to_symbols(detail::utf8_to_code_points(piece, "corpus"))];
    }
  }
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[symbols_of_byte(static_cast<unsigned char>(b))] = b;
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (int m = 0; m < kDemoMerges; ++m) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& [word, count] : words) {
      for (size_t k = 0; k + 1 < word.size(); ++k) pairs[{word[k], word[k + 1]}] += count;
    }
    if (pairs.empty()) break;
    // The most frequent pair; ties to the smallest (the map's order), so the file is reproducible.
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    const auto [left, right] = best->first;
    const std::string joined = left + right;
    if (!vocab.contains(joined)) vocab[joined] = static_cast<int64_t>(vocab.size());
    merges.push_back({left, right});
    std::map<Word, int64_t> next;
    for (const auto& [word, count] : words) {
      Word merged;
      for (size_t k = 0; k < word.size(); ++k) {
        if (k + 1 < word.size() && word[k] == left && word[k + 1] == right) {
          merged.push_back(joined);
          ++k;
        } else {
          merged.push_back(word[k]);
        }
      }
      next[merged] += count;
    }
    words = std::move(next);
  }
  // Qwen's added special tokens follow the vocabulary, as in Qwen3-VL's tokenizer.json.
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  int64_t id = static_cast<int64_t>(vocab.size());
  for (const char* token : {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                            "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"}) {
    added.push_back({{"id", id++}, {"content", token}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  const nlohmann::ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  nlohmann::ordered_json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", qwen2_split_pattern()}}}, {"behavior", "Isolated"}, {"invert", false}},
          byte_level}}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merges}}}};
  const nlohmann::ordered_json config = {
      {"tokenizer_class", "Qwen2Tokenizer"}, {"model_max_length", 262144}, {"add_bos_token", false},
      {"bos_token", nullptr}, {"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}, {"unk_token", nullptr},
      {"errors", "replace"}, {"split_special_tokens", false}};
  const std::filesystem::path root(dir);
  util::write_file_atomically((root / "tokenizer.json").string(), tokenizer.dump(2), "qwen2");
  util::write_file_atomically((root / "tokenizer_config.json").string(), config.dump(2), "qwen2");
}

}  // namespace remat::encoders
