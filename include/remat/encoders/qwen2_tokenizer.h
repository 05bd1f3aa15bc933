#pragma once
/// \file
/// The Qwen2 byte-level BPE tokenizer that Qwen3-VL (MageFlow's text encoder) uses, read from a
/// Hugging Face `tokenizer.json` and doing what the `tokenizers` library does with the pipeline
/// transformers' Qwen2Tokenizer builds (models/qwen2/tokenization_qwen2.py, transformers 5.25):
/// added tokens split out first (leftmost, longest; `lstrip` / `rstrip` take the whitespace
/// beside them), NFC, the pre-tokenizer regex
///   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
/// (Split, behaviour isolated), each piece's UTF-8 bytes mapped to GPT-2's printable byte symbols
/// (ByteLevel, no prefix space), merges applied by rank; no BOS or EOS is added.

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "remat/export.h"

namespace remat::encoders {

/// Largest text encode() accepts, in UTF-8 bytes (MageFlow's captions are cut at 2048 tokens).
inline constexpr size_t kMaxQwen2TextBytes = 1 << 20;

/// Qwen2's pre-tokenizer pattern, as tokenizer.json's Split stores it.
REMAT_API const std::string& qwen2_split_pattern();

/// The pieces the pattern cuts `text` (UTF-8, already normalised) into, in order; together they
/// are the whole text. Matching is the regex engine's: at each position the first alternative that
/// matches, its quantifiers greedy with backtracking; \p{L} and \p{N} are Unicode's letter and
/// number categories, \s Unicode's White_Space. Throws c10::ValueError for invalid UTF-8.
REMAT_API std::vector<std::string> qwen2_pre_tokenize(const std::string& text);

/// An added token of tokenizer.json (`added_tokens`).
struct Qwen2AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;  ///< matched in the normalised text instead of the raw one
};

class REMAT_API Qwen2Tokenizer {
 public:
  /// Reads `path` (a tokenizer.json). Its model must be BPE without byte fallback, unknown token,
  /// subword prefix or word suffix; its normalizer NFC (or none); its pre_tokenizer the Split of
  /// qwen2_split_pattern() then ByteLevel without prefix space and regex. Throws c10::ValueError
  /// naming the file and the part that differs (another model's tokenizer is refused by name).
  static Qwen2Tokenizer from_file(const std::string& path);
  /// `dir`/tokenizer.json.
  static Qwen2Tokenizer from_directory(const std::string& dir);

  /// Token ids of `text` (UTF-8, at most kMaxQwen2TextBytes), no special tokens added. Throws
  /// c10::ValueError for invalid UTF-8 or a text too long.
  std::vector<int64_t> encode(const std::string& text) const;
  /// The tokens of `text` as the vocabulary writes them (byte symbols; added tokens as written).
  std::vector<std::string> tokenize(const std::string& text) const;
  /// Text of `ids`: the tokens' bytes joined (added tokens written out). Throws for unknown ids.
  std::string decode(const std::vector<int64_t>& ids) const;

  /// The id of a token (vocabulary or added), if it has one.
  std::optional<int64_t> token_id(const std::string& token) const;
  /// Entries of the BPE vocabulary plus added tokens with new ids.
  int64_t vocab_size() const;
  int64_t merge_count() const { return static_cast<int64_t>(merge_ranks_.size()); }
  const std::vector<Qwen2AddedToken>& added_tokens() const { return added_; }

 private:
  Qwen2Tokenizer() = default;
  void append_word(const std::string& piece, std::vector<std::string>& tokens) const;
  void append_text(const std::string& text, std::vector<std::string>& tokens) const;

  std::string path_;
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<int64_t, std::string> id_to_token_;
  std::unordered_map<std::string, int64_t> merge_ranks_;  // "left right" -> rank
  std::vector<Qwen2AddedToken> added_;
  bool nfc_ = true;
  bool ignore_merges_ = false;
};

/// Writes a small but complete Qwen2 tokenizer.json (and tokenizer_config.json) into `dir`
/// (created if missing): the 256 byte symbols, merges learned here by BPE from a built-in
/// multilingual corpus (English, accented Latin, CJK, emoji: multi-byte symbols merge too), and
/// Qwen's added special tokens (<|endoftext|>, <|im_start|>, <|im_end|>, the vision markers) after
/// the vocabulary, in the tokenizers library's format. Every file is written atomically.
REMAT_API void write_demo_qwen2_tokenizer(const std::string& dir);

}  // namespace remat::encoders
