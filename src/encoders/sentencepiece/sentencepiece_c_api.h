#pragma once
// The C interface of libremat_sentencepiece, the shim that keeps Debian's libsentencepiece (which
// carries its own copy of protobuf) away from LibTorch's protobuf. Note [SentencePiece isolation]
// in src/encoders/sentencepiece/sentencepiece_loader.cpp explains why it exists and how it is loaded.
//
// Only C types cross this boundary: the shim lives in its own link-map namespace with its own
// C++ runtime and heap, so no std::string, exception or pointer it allocates may reach the caller
// except the opaque handle, which only the shim frees. Every function catches everything.
// Functions returning int report 0 on success and -1 on failure with a message in `error`
// (truncated to error_capacity - 1 bytes, always NUL-terminated). Functions filling a caller
// buffer return the size they need; a size above `capacity` means "call again with more room".

#include <stddef.h>
#include <stdint.h>

extern "C" {

typedef struct remat_sp_processor remat_sp_processor;
/// Bytes owned by the shim (a trained model); read with remat_sp_blob_*, then free.
typedef struct remat_sp_blob remat_sp_blob;

/// Bumped whenever a signature below changes; the loader refuses a shim of another version.
#define REMAT_SP_ABI_VERSION 1

typedef int (*remat_sp_abi_version_fn)(void);
/// Parses a serialized ModelProto (the bytes of a spiece.model). Null on failure.
typedef remat_sp_processor* (*remat_sp_load_fn)(const char* bytes, size_t size, char* error,
                                                size_t error_capacity);
typedef void (*remat_sp_free_fn)(remat_sp_processor* processor);
typedef int32_t (*remat_sp_piece_size_fn)(const remat_sp_processor* processor);
/// Piece-level information: returns the piece's byte length (filling `out` up to capacity).
typedef int64_t (*remat_sp_id_to_piece_fn)(const remat_sp_processor* processor, int32_t id,
                                           char* out, size_t capacity);
/// 1 when `id` is a control symbol (<pad>, </s>), 2 when unknown (<unk>), 0 otherwise.
typedef int32_t (*remat_sp_piece_kind_fn)(const remat_sp_processor* processor, int32_t id);
/// Encodes UTF-8 text to ids; returns the number of ids (or -1 with `error`).
typedef int64_t (*remat_sp_encode_fn)(const remat_sp_processor* processor, const char* text,
                                      size_t text_size, int32_t* ids, size_t capacity,
                                      char* error, size_t error_capacity);
/// Decodes ids to UTF-8 text; returns the byte length (or -1 with `error`).
typedef int64_t (*remat_sp_decode_fn)(const remat_sp_processor* processor, const int32_t* ids,
                                      size_t count, char* out, size_t capacity, char* error,
                                      size_t error_capacity);
/// Trains a model with SentencePieceTrainer::Train on `sentences` (no input file) and the
/// trainer flags given as name/value pairs ("model_type" -> "unigram"); the serialized
/// ModelProto comes back in `*model`. Returns 0 or -1 with `error`.
typedef int (*remat_sp_train_fn)(const char* const* flag_names, const char* const* flag_values,
                                 size_t flag_count, const char* const* sentences,
                                 size_t sentence_count, remat_sp_blob** model, char* error,
                                 size_t error_capacity);
typedef const char* (*remat_sp_blob_data_fn)(const remat_sp_blob* blob);
typedef size_t (*remat_sp_blob_size_fn)(const remat_sp_blob* blob);
typedef void (*remat_sp_blob_free_fn)(remat_sp_blob* blob);

}  // extern "C"
