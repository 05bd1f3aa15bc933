#pragma once
// Private: the SentencePiece shim (libremat_sentencepiece), loaded once per process in its own
// link-map namespace, and a handle type for one loaded model. See Note [SentencePiece isolation].

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sentencepiece/sentencepiece_c_api.h"

namespace remat::encoders::detail {

/// The shim's entry points. Loading failures throw c10::Error naming every path tried.
struct SentencePieceApi {
  remat_sp_load_fn load = nullptr;
  remat_sp_free_fn free = nullptr;
  remat_sp_piece_size_fn piece_size = nullptr;
  remat_sp_id_to_piece_fn id_to_piece = nullptr;
  remat_sp_piece_kind_fn piece_kind = nullptr;
  remat_sp_encode_fn encode = nullptr;
  remat_sp_decode_fn decode = nullptr;
  remat_sp_train_fn train = nullptr;
  remat_sp_blob_data_fn blob_data = nullptr;
  remat_sp_blob_size_fn blob_size = nullptr;
  remat_sp_blob_free_fn blob_free = nullptr;
  std::string path;  ///< the file it was loaded from
};

/// The process-wide shim (loaded on first use; thread-safe; never unloaded).
const SentencePieceApi& sentencepiece_api();

/// One parsed ModelProto. Immutable after construction, so one model may encode from many
/// threads (SentencePieceProcessor::Encode is const).
class SentencePieceModel {
 public:
  /// Parses `bytes`; throws remat::throw_value_error "[t5-tokenizer] <source> ..." when they are
  /// not a SentencePiece model.
  SentencePieceModel(const std::string& bytes, const std::string& source);
  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  int32_t piece_size() const;
  std::string id_to_piece(int32_t id) const;
  /// 1 control, 2 unknown, 0 normal.
  int32_t piece_kind(int32_t id) const;
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  const SentencePieceApi& api_;
  remat_sp_processor* handle_ = nullptr;
};

/// Trains a model on `sentences` with `flags` (trainer flag name -> value) and returns the
/// serialized ModelProto. Throws c10::Error with the trainer's message on failure.
std::string train_sentencepiece(const std::vector<std::pair<std::string, std::string>>& flags,
                                const std::vector<std::string>& sentences);

}  // namespace remat::encoders::detail
