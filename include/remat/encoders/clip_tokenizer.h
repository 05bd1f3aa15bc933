#pragma once
/// \file
/// CLIP's byte-level BPE tokenizer (`tokenizer/` of a diffusers Flux folder: vocab.json and
/// merges.txt), doing what transformers' slow CLIPTokenizer does when ftfy is not installed:
/// BERT-style clean-up (control characters dropped, whitespace runs collapsed, spaces around CJK
/// ideographs, NFC, lower case with accents kept), the split regex
/// `'s|'t|'re|'ve|'m|'ll|'d|\p{L}+|\p{N}|[^\s\p{L}\p{N}]+`, bytes mapped to printable symbols,
/// `</w>` on each word's last symbol, merges applied by rank. See docs/CLIP.md.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "remat/export.h"

namespace remat::encoders {

/// One tokenized caption, as FluxPipeline asks for it (padding="max_length", truncation=True).
struct ClipEncoding {
  /// bos, up to max_length - 2 content ids, eos, then the pad id up to max_length.
  std::vector<int64_t> ids;
  /// 1 for bos, content and eos; 0 for padding.
  std::vector<int64_t> attention_mask;
  /// The decoded content tokens that did not fit (empty when nothing was cut).
  std::string removed_text;
  /// diffusers' warning for a cut caption ("The following part of your input was truncated
  /// because CLIP can only handle sequences up to 77 tokens: ['…']"); empty when nothing was cut.
  std::string truncation_message() const;
  /// max_length used by encode().
  int64_t max_length = 77;
};

/// Largest caption encode() accepts, in UTF-8 bytes. BPE is quadratic in a word's length, and a
/// caption past a few hundred words is cut to 75 tokens anyway.
inline constexpr size_t kMaxClipCaptionBytes = 16384;

class REMAT_API ClipTokenizer {
 public:
  /// Reads `dir`/vocab.json and `dir`/merges.txt, then the special tokens from
  /// `dir`/tokenizer_config.json and `dir`/special_tokens_map.json when present (bos_token,
  /// eos_token, pad_token, unk_token; transformers' defaults otherwise: `<|startoftext|>` and
  /// `<|endoftext|>` for the other three).
  static ClipTokenizer from_directory(const std::string& dir);
  /// From the two files, with the default special tokens.
  static ClipTokenizer from_files(const std::string& vocab_json, const std::string& merges_txt);

  /// Tokenizes `caption` (UTF-8, at most kMaxClipCaptionBytes) to exactly `max_length` ids.
  /// Invalid UTF-8 or a too long caption throws c10::ValueError.
  ClipEncoding encode(const std::string& caption, int64_t max_length = 77) const;

  /// The content tokens of `caption` (no bos/eos), as BPE symbols, e.g. "a</w>", "red</w>".
  std::vector<std::string> tokenize(const std::string& caption) const;
  /// The content ids of `caption` (no bos/eos, no truncation).
  std::vector<int64_t> content_ids(const std::string& caption) const;
  /// Text of content ids, as the slow tokenizer decodes them (symbols back to bytes, `</w>` to a
  /// space, trimmed; special tokens written out, separated by spaces).
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }
  /// Number of entries in vocab.json.
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  /// Number of merges read (at most 49152 - 256 - 2, as transformers reads them).
  int64_t merge_count() const { return static_cast<int64_t>(merge_ranks_.size()); }

  /// The special-token strings (bos, eos, pad, unk) the tokenizer uses.
  struct SpecialTokens {
    std::string bos = "<|startoftext|>";
    std::string eos = "<|endoftext|>";
    std::string pad = "<|endoftext|>";
    std::string unk = "<|endoftext|>";
  };

 private:
  ClipTokenizer() = default;
  static ClipTokenizer build(const std::string& vocab_json, const std::string& merges_txt,
                             const SpecialTokens& specials);
  std::string bpe(const std::string& word) const;
  int64_t id_of(const std::string& symbol) const;
  void append_ids(const std::string& caption, std::vector<int64_t>& ids) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<int64_t, std::string> id_to_token_;
  std::unordered_map<std::string, int64_t> merge_ranks_;  // "left right" -> rank
  SpecialTokens specials_;
  int64_t bos_id_ = 0, eos_id_ = 0, pad_id_ = 0, unk_id_ = 0;
};

/// Writes a small but complete CLIP tokenizer into `dir` (created if missing): vocab.json with
/// the 256 byte symbols, their `</w>` forms, 218 merges learned by BPE from a built-in English
/// corpus, `<|startoftext|>` (730) and `<|endoftext|>` (731) — 732 ids, ClipTextConfig::tiny()'s
/// vocab_size — plus merges.txt ("#version: 0.2" header), tokenizer_config.json and
/// special_tokens_map.json as transformers writes them for CLIP. For tests and demos.
REMAT_API void write_tiny_clip_tokenizer(const std::string& dir);

}  // namespace remat::encoders
