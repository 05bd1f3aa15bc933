// write_tiny_clip_tokenizer: a small CLIP tokenizer folder whose merges are learned here by BPE
// from a built-in corpus, laid out as CLIP's own files are (vocab order: byte symbols, their
// "</w>" forms, one entry per merge, the two special tokens), so every code path of the real
// tokenizer runs on it.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "clip_text_normalize.h"
#include "remat/encoders/clip_tokenizer.h"
#include "remat/util/error.h"

namespace remat::encoders {
namespace {

// 512 byte symbols + kTinyMerges + 2 special tokens = ClipTextConfig::tiny().vocab_size (732).
constexpr int kTinyMerges = 218;

// Captions of the kind the demo pipeline draws (shapes, colours, places), plus common words.
constexpr const char* kCorpus[] = {
    "a red square on a blue background",
    "a green circle on a white background",
    "a yellow triangle on a black background",
    "two red squares and a blue circle",
    "three green circles on a purple background",
    "a small white cross in the middle of the picture",
    "a large orange star next to a grey stripe",
    "the photo of a cat sitting on a wooden table",
    "a photo of a dog running in the green grass",
    "a painting of a mountain landscape at sunset",
    "a drawing of a house with a red roof and a blue door",
    "an illustration of the city at night with bright lights",
    "a portrait of a woman wearing a yellow hat",
    "a close up photo of a flower in the garden",
    "there is a small boat on the water under the bright sky",
    "a blue square and a red circle and a yellow triangle",
    "an orange background with white dots and black lines",
    "the background is black and the circle is white",
    "a purple stripe across a green square",
    "a picture of a bird flying over the sea",
    "a cup of coffee on a table next to a book",
    "a street in the rain with people walking",
    "a forest with tall trees and a small river",
    "a child playing with a red ball in the park",
    "the sun is shining over the blue ocean",
    "a black and white photo of an old building",
    "squares circles triangles crosses stars and stripes",
    "colours red green blue yellow orange purple white black grey",
};

using Word = std::vector<std::string>;

}  // namespace

void write_tiny_clip_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_value_error("[clip] cannot create tokenizer directory '" + dir + "': " + ec.message());

  // Word frequencies over the corpus, pre-tokenized as the tokenizer will see the text.
  std::map<Word, int64_t> words;
  for (const char* line : kCorpus) {
    const auto clean = detail::clean_caption(detail::utf8_to_code_points(line, "corpus"));
    for (const auto& w : detail::split_words(clean)) {
      Word symbols = detail::word_to_symbols(w);
      symbols.back() += "</w>";
      ++words[symbols];
    }
  }

  // Vocabulary order of CLIP's vocab.json: the byte symbols in bytes_to_unicode() order (the
  // printable bytes first, then the remapped ones), then the same with "</w>".
  std::vector<std::string> vocab;
  std::vector<int> byte_order;
  for (int b = 0; b < 256; ++b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) byte_order.push_back(b);
  }
  for (int b = 0; b < 256; ++b) {
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) byte_order.push_back(b);
  }
  for (int b : byte_order) vocab.push_back(detail::code_points_to_utf8(std::u32string(1, detail::byte_symbols()[b])));
  for (size_t i = 0; i < 256; ++i) vocab.push_back(vocab[i] + "</w>");
  std::set<std::string> known(vocab.begin(), vocab.end());

  // Plain BPE training: merge the most frequent adjacent pair (ties: the smallest pair), skipping
  // pairs whose concatenation is already a token, so that every merge adds one new id.
  std::vector<std::pair<std::string, std::string>> merges;
  while (static_cast<int>(merges.size()) < kTinyMerges) {
    std::map<std::pair<std::string, std::string>, int64_t> counts;
    for (const auto& [word, n] : words) {
      for (size_t i = 0; i + 1 < word.size(); ++i) counts[{word[i], word[i + 1]}] += n;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int64_t best_count = 0;
    for (const auto& [pair, n] : counts) {
      if (n > best_count && !known.count(pair.first + pair.second)) best = &pair, best_count = n;
    }
    TORCH_INTERNAL_ASSERT(best != nullptr, "the built-in corpus yields fewer than ", kTinyMerges, " merges");
    const auto merge = *best;
    merges.push_back(merge);
    known.insert(merge.first + merge.second);
    vocab.push_back(merge.first + merge.second);
    std::map<Word, int64_t> next;
    for (const auto& [word, n] : words) {
      Word merged;
      for (size_t i = 0; i < word.size();) {
        if (i + 1 < word.size() && word[i] == merge.first && word[i + 1] == merge.second) {
          merged.push_back(merge.first + merge.second);
          i += 2;
        } else {
          merged.push_back(word[i++]);
        }
      }
      next[merged] += n;
    }
    words.swap(next);
  }
  vocab.push_back("<|startoftext|>");
  vocab.push_back("<|endoftext|>");

  nlohmann::ordered_json vocab_json;
  for (size_t i = 0; i < vocab.size(); ++i) vocab_json[vocab[i]] = static_cast<int64_t>(i);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream out(fs::path(dir) / name, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) throw_value_error("[clip] cannot write tokenizer file '" + (fs::path(dir) / name).string() + "'");
  };
  write("vocab.json", vocab_json.dump() + "\n");
  std::string merges_txt = "#version: 0.2\n";
  for (const auto& [a, b] : merges) merges_txt += a + " " + b + "\n";
  write("merges.txt", merges_txt);

  nlohmann::ordered_json config;
  config["add_prefix_space"] = false;
  config["bos_token"] = "<|startoftext|>";
  config["do_lower_case"] = true;
  config["eos_token"] = "<|endoftext|>";
  config["errors"] = "replace";
  config["model_max_length"] = 77;
  config["pad_token"] = "<|endoftext|>";
  config["tokenizer_class"] = "CLIPTokenizer";
  config["unk_token"] = "<|endoftext|>";
  write("tokenizer_config.json", config.dump(2) + "\n");
  nlohmann::ordered_json specials;
  specials["bos_token"] = "<|startoftext|>";
  specials["eos_token"] = "<|endoftext|>";
  specials["pad_token"] = "<|endoftext|>";
  specials["unk_token"] = "<|endoftext|>";
  write("special_tokens_map.json", specials.dump(2) + "\n");
}

}  // namespace remat::encoders
