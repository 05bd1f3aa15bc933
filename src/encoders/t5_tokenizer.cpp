#include "remat/encoders/t5_tokenizer.h"

#include <c10/util/Exception.h>

#include "remat/util/error.h"
#include "remat/util/files.h"
#include "sentencepiece/sentencepiece_loader.h"

// Behaviour of transformers' models/t5/tokenization_t5.py (T5Tokenizer, legacy=True) under
// PreTrainedTokenizerBase's padding="max_length", truncation=True; docs/T5.md.

namespace remat::encoders {
namespace {

constexpr const char* kT5TokenizerComponent = "t5-tokenizer";
// A real spiece.model is ~0.8 MB; anything far larger is not one.
constexpr uint64_t kMaxModelBytes = 64ull << 20;

std::string extra_id_string(int64_t k) { return "<extra_id_" + std::to_string(k) + ">"; }

// If `text` at `pos` starts with a special-token string, its id (and length); else -1.
int64_t special_at(const std::string& text, size_t pos, int64_t vocab_size, size_t& length) {
  static const std::pair<const char*, int64_t> kFixed[] = {
      {"</s>", T5Tokenizer::kEosId}, {"<pad>", T5Tokenizer::kPadId}, {"<unk>", T5Tokenizer::kUnkId}};
  for (const auto& [s, id] : kFixed) {
    if (text.compare(pos, std::char_traits<char>::length(s), s) == 0) {
      length = std::char_traits<char>::length(s);
      return id;
    }
  }
  static const std::string kExtra = "<extra_id_";
  if (text.compare(pos, kExtra.size(), kExtra) != 0) return -1;
  size_t end = pos + kExtra.size();
  int64_t k = 0;
  size_t digits = 0;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end])) && digits < 3) {
    k = 10 * k + (text[end] - '0');
    ++end;
    ++digits;
  }
  if (digits == 0 || end >= text.size() || text[end] != '>' || k >= T5Tokenizer::kExtraIds) return -1;
  // "<extra_id_07>" is not the token "<extra_id_7>".
  if (digits > 1 && text[pos + kExtra.size()] == '0') return -1;
  length = end + 1 - pos;
  return vocab_size - 1 - k;
}

// The built-in corpus of train_tiny_spiece_model: simple scene captions, lower case.
const std::vector<std::string>& builtin_corpus() {
  static const std::vector<std::string> corpus = {
      "a red square on a blue background",
      "a green circle on a white background",
      "a yellow triangle on a black background",
      "a purple stripe across a grey sky",
      "two small dots next to a large circle",
      "the quick brown fox jumps over the lazy dog",
      "a photo of a cat sitting on a wooden table",
      "a painting of a house by the river at sunset",
      "an orange car parked in front of a tall building",
      "a bowl of fresh fruit with apples and bananas",
      "a white cross on a red flag",
      "a dog running across a field of green grass",
      "three blue birds sitting on a wire",
      "a mountain lake reflecting the morning light",
      "a close up of a flower with pink petals",
      "a city street at night with bright lights",
      "a small boat floating on a calm sea",
      "a child holding a red balloon in the park",
      "a plate of pasta with tomato sauce",
      "an old map with faded colors and a compass",
      "a robot standing in a field of sunflowers",
      "a cup of coffee on a desk next to a laptop",
      "a forest path covered with autumn leaves",
      "a black and white photo of a train station",
      "a bright star shining above the snowy hills",
      "squares and circles and triangles in many colors",
      "it is a simple drawing with thin lines",
      "the background is dark and the shapes are light",
  };
  return corpus;
}

}  // namespace

T5Tokenizer::T5Tokenizer(std::shared_ptr<const detail::SentencePieceModel> model)
    : model_(std::move(model)), piece_count_(model_->piece_size()) {}

T5Tokenizer T5Tokenizer::from_bytes(const std::string& bytes, const std::string& source) {
  auto model = std::make_shared<const detail::SentencePieceModel>(bytes, source);
  // T5's conventions are fixed ids, not read from the file: check the model agrees.
  const std::pair<int64_t, const char*> expected[] = {{kPadId, "<pad>"}, {kEosId, "</s>"}, {kUnkId, "<unk>"}};
  for (const auto& [id, piece] : expected) {
    const std::string got = id < model->piece_size() ? model->id_to_piece(static_cast<int32_t>(id)) : "";
    if (got != piece) {
      throw_value_error("[t5-tokenizer] " + source + " is not a T5 SentencePiece model: id " +
                        std::to_string(id) + " must be the piece '" + piece + "', got '" + got +
                        "' (T5 needs <pad> 0, </s> 1, <unk> 2)");
    }
  }
  return T5Tokenizer(std::move(model));
}

T5Tokenizer T5Tokenizer::from_file(const std::string& path) {
  const std::string bytes = util::read_regular_file(path, kMaxModelBytes, kT5TokenizerComponent, "spiece.model");
  return from_bytes(bytes, "'" + path + "'");
}

int64_t T5Tokenizer::vocab_size() const { return piece_count_ + kExtraIds; }

void T5Tokenizer::check_id(int64_t id) const {
  if (id < 0 || id >= vocab_size()) {
    throw_value_error("[t5-tokenizer] id must be in [0, " + std::to_string(vocab_size()) +
                      "), got " + std::to_string(id));
  }
}

bool T5Tokenizer::is_special(int64_t id) const {
  return id == kPadId || id == kEosId || id == kUnkId || id >= piece_count_;
}

std::string T5Tokenizer::id_to_piece(int64_t id) const {
  check_id(id);
  if (id >= piece_count_) return extra_id_string(vocab_size() - 1 - id);
  return model_->id_to_piece(static_cast<int32_t>(id));
}

std::vector<int64_t> T5Tokenizer::encode_ids(const std::string& text) const {
  // Split at special-token strings (transformers' added-token trie); legacy mode encodes each
  // chunk separately, so the text after a special token gets its own "▁" prefix.
  std::vector<int64_t> ids;
  std::string chunk;
  auto flush = [&]() {
    if (chunk.empty()) return;
    for (int32_t id : model_->encode(chunk)) ids.push_back(id);
    chunk.clear();
  };
  for (size_t pos = 0; pos < text.size();) {
    size_t length = 0;
    const int64_t special = text[pos] == '<' ? special_at(text, pos, vocab_size(), length) : -1;
    if (special >= 0) {
      flush();
      ids.push_back(special);
      pos += length;
    } else {
      chunk += text[pos++];
    }
  }
  flush();
  return ids;
}

T5Encoding T5Tokenizer::encode(const std::string& caption, int64_t max_length) const {
  if (max_length < 1) {
    throw_value_error("[t5-tokenizer] max_length must be >= 1 (room for </s>), got " +
                      std::to_string(max_length));
  }
  std::vector<int64_t> content = encode_ids(caption);
  T5Encoding out;
  // One special token (</s>) is added, so the content keeps max_length - 1 ids.
  const size_t keep = static_cast<size_t>(max_length - 1);
  if (content.size() > keep) {
    out.removed_text = decode({content.begin() + keep, content.end()}, /*skip_special_tokens=*/false);
    content.resize(keep);
  }
  out.ids = content;
  // transformers' _add_eos_if_not_present: a caption ending in "</s>" gets no second one.
  if (out.ids.empty() || out.ids.back() != kEosId) out.ids.push_back(kEosId);
  out.attention_mask.assign(out.ids.size(), 1);
  out.ids.resize(max_length, kPadId);
  out.attention_mask.resize(max_length, 0);
  return out;
}

std::string T5Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  // transformers' convert_tokens_to_string: runs of ordinary pieces go through SentencePiece's
  // decoder; special tokens are written as their strings, with a space before each run of them.
  std::string out;
  std::vector<int32_t> run;
  bool previous_special = false;
  for (int64_t id : ids) {
    check_id(id);
    if (!is_special(id)) {
      run.push_back(static_cast<int32_t>(id));
      previous_special = false;
      continue;
    }
    if (skip_special_tokens) continue;
    if (!previous_special) out += " ";
    out += model_->decode(run) + id_to_piece(id);
    run.clear();
    previous_special = true;
  }
  out += model_->decode(run);
  const auto first = out.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  return out.substr(first, out.find_last_not_of(' ') - first + 1);
}

std::string t5_truncation_warning(int64_t max_length, const std::string& removed_text) {
  return "The following part of your input was truncated because `max_sequence_length` is set to " +
         std::to_string(max_length) + " tokens: " + removed_text;
}

void train_tiny_spiece_model(const std::string& output_path, const std::vector<std::string>& corpus,
                             int64_t vocab_size) {
  if (vocab_size < 8) {
    throw_value_error("[t5-tokenizer] vocab_size must be >= 8, got " + std::to_string(vocab_size));
  }
  // T5's special pieces at fixed ids; deterministic: one thread, every sentence, no shuffling,
  // no sampling. hard_vocab_limit off: a small corpus may yield fewer pieces than asked for.
  const std::vector<std::pair<std::string, std::string>> flags = {
      {"model_type", "unigram"},
      {"vocab_size", std::to_string(vocab_size)},
      {"hard_vocab_limit", "false"},
      {"pad_id", "0"},
      {"eos_id", "1"},
      {"unk_id", "2"},
      {"bos_id", "-1"},
      {"pad_piece", "<pad>"},
      {"eos_piece", "</s>"},
      {"unk_piece", "<unk>"},
      {"normalization_rule_name", "nmt_nfkc"},
      {"character_coverage", "1.0"},
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"minloglevel", "2"},
  };
  const std::string model = detail::train_sentencepiece(flags, corpus.empty() ? builtin_corpus() : corpus);
  util::write_file_atomically(output_path, model, kT5TokenizerComponent);
}

}  // namespace remat::encoders
