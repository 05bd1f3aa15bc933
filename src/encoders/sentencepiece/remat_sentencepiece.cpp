// libremat_sentencepiece: Debian's SentencePiece behind the C interface of sentencepiece_c_api.h.
// Built without the project's sanitizer flags and loaded into its own link-map namespace (Note
// [SentencePiece isolation], src/encoders/sentencepiece/sentencepiece_loader.cpp), so it must not
// use LibTorch.

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "sentencepiece_c_api.h"

#define REMAT_SP_EXPORT extern "C" __attribute__((visibility("default")))

struct remat_sp_processor {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

void write_error(const std::string& message, char* error, size_t capacity) {
  if (error == nullptr || capacity == 0) return;
  const size_t n = std::min(message.size(), capacity - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

int64_t copy_out(const std::string& text, char* out, size_t capacity) {
  if (out != nullptr) std::memcpy(out, text.data(), std::min(text.size(), capacity));
  return static_cast<int64_t>(text.size());
}

}  // namespace

REMAT_SP_EXPORT int remat_sp_abi_version(void) { return REMAT_SP_ABI_VERSION; }

REMAT_SP_EXPORT remat_sp_processor* remat_sp_load(const char* bytes, size_t size, char* error,
                                                  size_t error_capacity) {
  try {
    auto* handle = new remat_sp_processor();
    const auto status = handle->processor.LoadFromSerializedProto(std::string(bytes, size));
    if (!status.ok()) {
      write_error(status.ToString(), error, error_capacity);
      delete handle;
      return nullptr;
    }
    return handle;
  } catch (const std::exception& e) {
    write_error(e.what(), error, error_capacity);
  } catch (...) {
    write_error("unknown exception in SentencePiece", error, error_capacity);
  }
  return nullptr;
}

REMAT_SP_EXPORT void remat_sp_free(remat_sp_processor* processor) { delete processor; }

REMAT_SP_EXPORT int32_t remat_sp_piece_size(const remat_sp_processor* processor) {
  return processor->processor.GetPieceSize();
}

REMAT_SP_EXPORT int64_t remat_sp_id_to_piece(const remat_sp_processor* processor, int32_t id,
                                             char* out, size_t capacity) {
  try {
    return copy_out(processor->processor.IdToPiece(id), out, capacity);
  } catch (...) {
    return -1;
  }
}

REMAT_SP_EXPORT int32_t remat_sp_piece_kind(const remat_sp_processor* processor, int32_t id) {
  if (processor->processor.IsControl(id)) return 1;
  if (processor->processor.IsUnknown(id)) return 2;
  return 0;
}

REMAT_SP_EXPORT int64_t remat_sp_encode(const remat_sp_processor* processor, const char* text,
                                        size_t text_size, int32_t* ids, size_t capacity,
                                        char* error, size_t error_capacity) {
  try {
    std::vector<int> out;
    const auto status = processor->processor.Encode(std::string(text, text_size), &out);
    if (!status.ok()) {
      write_error(status.ToString(), error, error_capacity);
      return -1;
    }
    for (size_t i = 0; i < out.size() && i < capacity; ++i) ids[i] = out[i];
    return static_cast<int64_t>(out.size());
  } catch (const std::exception& e) {
    write_error(e.what(), error, error_capacity);
  } catch (...) {
    write_error("unknown exception in SentencePiece", error, error_capacity);
  }
  return -1;
}

REMAT_SP_EXPORT int64_t remat_sp_decode(const remat_sp_processor* processor, const int32_t* ids,
                                        size_t count, char* out, size_t capacity, char* error,
                                        size_t error_capacity) {
  try {
    std::string text;
    const std::vector<int> in(ids, ids + count);
    const auto status = processor->processor.Decode(in, &text);
    if (!status.ok()) {
      write_error(status.ToString(), error, error_capacity);
      return -1;
    }
    return copy_out(text, out, capacity);
  } catch (const std::exception& e) {
    write_error(e.what(), error, error_capacity);
  } catch (...) {
    write_error("unknown exception in SentencePiece", error, error_capacity);
  }
  return -1;
}

struct remat_sp_blob {
  std::string bytes;
};

namespace {

// Feeds the caller's sentences to the trainer (no corpus file on disk).
class ArraySentences : public sentencepiece::SentenceIterator {
 public:
  ArraySentences(const char* const* sentences, size_t count) {
    for (size_t i = 0; i < count; ++i) sentences_.emplace_back(sentences[i]);
  }
  bool done() const override { return index_ >= sentences_.size(); }
  void Next() override { ++index_; }
  const std::string& value() const override { return sentences_[index_]; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  std::vector<std::string> sentences_;
  size_t index_ = 0;
};

}  // namespace

REMAT_SP_EXPORT int remat_sp_train(const char* const* flag_names, const char* const* flag_values,
                                   size_t flag_count, const char* const* sentences,
                                   size_t sentence_count, remat_sp_blob** model, char* error,
                                   size_t error_capacity) {
  try {
    std::unordered_map<std::string, std::string> flags;
    for (size_t i = 0; i < flag_count; ++i) flags[flag_names[i]] = flag_values[i];
    ArraySentences iterator(sentences, sentence_count);
    auto blob = std::make_unique<remat_sp_blob>();
    const auto status = sentencepiece::SentencePieceTrainer::Train(flags, &iterator, &blob->bytes);
    if (!status.ok()) {
      write_error(status.ToString(), error, error_capacity);
      return -1;
    }
    *model = blob.release();
    return 0;
  } catch (const std::exception& e) {
    write_error(e.what(), error, error_capacity);
  } catch (...) {
    write_error("unknown exception in the SentencePiece trainer", error, error_capacity);
  }
  return -1;
}

REMAT_SP_EXPORT const char* remat_sp_blob_data(const remat_sp_blob* blob) { return blob->bytes.data(); }
REMAT_SP_EXPORT size_t remat_sp_blob_size(const remat_sp_blob* blob) { return blob->bytes.size(); }
REMAT_SP_EXPORT void remat_sp_blob_free(remat_sp_blob* blob) { delete blob; }
