#pragma once
/// \file
/// T5's SentencePiece tokenizer (`tokenizer_2/spiece.model` of a Flux pipeline folder), with the
/// behaviour of transformers' T5Tokenizer (legacy mode, as Flux's tokenizer_config sets it) under
/// FluxPipeline's call: padding="max_length", truncation=True. docs/T5.md describes it.
///
/// SentencePiece runs in the shim library libremat_sentencepiece, isolated from LibTorch's
/// protobuf (Note [SentencePiece isolation] in src/encoders/sentencepiece/sentencepiece_loader.cpp);
/// it must be installed beside remat's libraries.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remat/export.h"

namespace remat::encoders {

namespace detail {
class SentencePieceModel;
}

/// One caption, tokenized.
struct T5Encoding {
  std::vector<int64_t> ids;             ///< max_length ids: content, </s> (1), then <pad> (0)
  std::vector<int64_t> attention_mask;  ///< 1 for content and </s>, 0 for padding
  std::string removed_text;             ///< decoded content cut by truncation ("" if none)
};

/// T5's tokenizer over a SentencePiece unigram model.
///
/// Ids: piece i is id i (T5: 0 `<pad>`, 1 `</s>`, 2 `<unk>`); `<extra_id_k>` is
/// vocab_size() - 1 - k for k < 100 (transformers' extra_ids). Thread-safe after construction.
class REMAT_API T5Tokenizer {
 public:
  static constexpr int64_t kPadId = 0;
  static constexpr int64_t kEosId = 1;
  static constexpr int64_t kUnkId = 2;
  static constexpr int64_t kExtraIds = 100;

  /// Reads a spiece.model. Throws remat::throw_value_error ("[t5-tokenizer] '<path>' ...") for a
  /// missing, unreadable or non-regular file, bytes that are not a SentencePiece model, or a
  /// model without T5's special pieces (<pad> 0, </s> 1, <unk> 2).
  static T5Tokenizer from_file(const std::string& path);

  /// The same from the bytes of a model; `source` names it in messages.
  static T5Tokenizer from_bytes(const std::string& bytes, const std::string& source);

  /// Tokenizes `caption` for the encoder: text split at special-token strings (`</s>`, `<pad>`,
  /// `<unk>`, `<extra_id_k>`, which map to their ids), each piece SentencePiece-encoded
  /// (NFKC normalisation, whitespace collapsed, "▁" prefix, Viterbi segmentation, unknown
  /// characters merged into one <unk>); the content truncated to max_length - 1 ids, `</s>`
  /// appended (unless the content already ends with it), padded with 0 to max_length.
  /// `max_length` must be >= 1.
  T5Encoding encode(const std::string& caption, int64_t max_length) const;

  /// The content ids of `text` (no `</s>`, no truncation, no padding).
  std::vector<int64_t> encode_ids(const std::string& text) const;

  /// Text of `ids`. With skip_special_tokens, <pad>, </s>, <unk> and <extra_id_k> are dropped;
  /// otherwise they are written as their strings, as transformers' decode does.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = true) const;

  /// SentencePiece pieces + 100 extra ids (32,100 for T5's model).
  int64_t vocab_size() const;
  /// The piece string of an id (`<extra_id_k>` for the extra ids).
  std::string id_to_piece(int64_t id) const;

 private:
  explicit T5Tokenizer(std::shared_ptr<const detail::SentencePieceModel> model);
  bool is_special(int64_t id) const;
  void check_id(int64_t id) const;

  std::shared_ptr<const detail::SentencePieceModel> model_;
  int64_t piece_count_ = 0;
};

/// diffusers' warning for a truncated T5 prompt: "The following part of your input was
/// truncated because `max_sequence_length` is set to <N> tokens: <removed_text>".
REMAT_API std::string t5_truncation_warning(int64_t max_length, const std::string& removed_text);

/// Trains a small real SentencePiece unigram model with T5's settings (pad 0, eos 1, unk 2, no
/// bos, nmt_nfkc normalisation) and writes it to `output_path` (atomically). `corpus` lines are
/// the training text; empty: a built-in English corpus of simple scene captions. Deterministic
/// (single thread, no sampling or shuffling). For tests and the demo pipeline, not for quality.
REMAT_API void train_tiny_spiece_model(const std::string& output_path,
                                       const std::vector<std::string>& corpus = {},
                                       int64_t vocab_size = 120);

}  // namespace remat::encoders
