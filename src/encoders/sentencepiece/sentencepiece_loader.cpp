#include "sentencepiece/sentencepiece_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <mutex>

#include <c10/util/Exception.h>

#include "remat/util/error.h"

// Note [SentencePiece isolation]
// Debian's libsentencepiece.so.0 carries its own copy of protobuf-lite 3.14 and exports its
// symbols; LibTorch links the system libprotobuf.so.32 (3.21). In one link-map namespace the two
// copies interpose on each other, whichever order they load in:
//  * linked into the program, libsentencepiece comes first in the global scope and libprotobuf's
//    static initialisers run sentencepiece's MergeFromImpl: segfault before main();
//  * dlopen(RTLD_LOCAL) after LibTorch: sentencepiece's generated code binds to libprotobuf 3.21
//    and every call fails its version check ("compiled against 3.14.0 ... installed 3.21.12");
//  * dlopen(RTLD_DEEPBIND) works, but AddressSanitizer refuses RTLD_DEEPBIND (the project's
//    `make sanitize` build);
//  * Debian ships no static libsentencepiece, so -Wl,--exclude-libs cannot hide its protobuf.
// So libremat_sentencepiece (a small shim linked against libsentencepiece) is loaded with
// dlmopen(LM_ID_NEWLM): a fresh namespace with its own libsentencepiece, C++ runtime and libc and
// no libprotobuf, in normal and ASan builds alike. Only C types cross (sentencepiece_c_api.h),
// because the shim's heap and C++ runtime are not ours. The shim is built without sanitizers.
// Namespaces are a scarce resource (glibc allows 16), so the shim is loaded once per process.

namespace remat::encoders::detail {
namespace {

bool is_file(const std::string& path) {
  struct stat st {};
  return !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

template <class Fn>
Fn symbol(void* handle, const char* name, const std::string& path) {
  void* p = ::dlsym(handle, name);
  TORCH_CHECK(p != nullptr, "[t5-tokenizer] the SentencePiece shim '", path, "' has no symbol ",
              name, " (a different version of libremat_sentencepiece?)");
  return reinterpret_cast<Fn>(p);
}

SentencePieceApi load_api() {
  // The build tree's shim first (tests and tools run from the build tree), then the installed
  // one, then the dynamic loader's search path (LD_LIBRARY_PATH, ld.so.cache).
  const std::vector<std::string> candidates = {REMAT_SENTENCEPIECE_SHIM_BUILD_PATH,
                                               REMAT_SENTENCEPIECE_SHIM_INSTALL_PATH,
                                               REMAT_SENTENCEPIECE_SHIM_NAME};
  std::string tried;
  for (const auto& candidate : candidates) {
    const bool bare_name = candidate.find('/') == std::string::npos;
    if (!bare_name && !is_file(candidate)) {
      tried += "\n  " + candidate + ": no such file";
      continue;
    }
    void* handle = ::dlmopen(LM_ID_NEWLM, candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      tried += "\n  " + candidate + ": " + (why ? why : "dlmopen failed");
      continue;
    }
    const auto version = symbol<remat_sp_abi_version_fn>(handle, "remat_sp_abi_version", candidate);
    TORCH_CHECK(version() == REMAT_SP_ABI_VERSION, "[t5-tokenizer] the SentencePiece shim '",
                candidate, "' has interface version ", version(), ", this library needs ",
                REMAT_SP_ABI_VERSION, " (reinstall remat)");
    SentencePieceApi api;
    api.path = candidate;
    api.load = symbol<remat_sp_load_fn>(handle, "remat_sp_load", candidate);
    api.free = symbol<remat_sp_free_fn>(handle, "remat_sp_free", candidate);
    api.piece_size = symbol<remat_sp_piece_size_fn>(handle, "remat_sp_piece_size", candidate);
    api.id_to_piece = symbol<remat_sp_id_to_piece_fn>(handle, "remat_sp_id_to_piece", candidate);
    api.piece_kind = symbol<remat_sp_piece_kind_fn>(handle, "remat_sp_piece_kind", candidate);
    api.encode = symbol<remat_sp_encode_fn>(handle, "remat_sp_encode", candidate);
    api.decode = symbol<remat_sp_decode_fn>(handle, "remat_sp_decode", candidate);
    api.train = symbol<remat_sp_train_fn>(handle, "remat_sp_train", candidate);
    api.blob_data = symbol<remat_sp_blob_data_fn>(handle, "remat_sp_blob_data", candidate);
    api.blob_size = symbol<remat_sp_blob_size_fn>(handle, "remat_sp_blob_size", candidate);
    api.blob_free = symbol<remat_sp_blob_free_fn>(handle, "remat_sp_blob_free", candidate);
    return api;  // never dlclose'd: models may outlive any owner, and namespaces are not reused
  }
  TORCH_CHECK(false, "[t5-tokenizer] cannot load the SentencePiece shim libremat_sentencepiece "
              "(installed with remat's library); tried:", tried);
}

constexpr size_t kErrorCapacity = 1024;

}  // namespace

const SentencePieceApi& sentencepiece_api() {
  static const SentencePieceApi api = load_api();  // C++11: initialised once, thread-safe
  return api;
}

SentencePieceModel::SentencePieceModel(const std::string& bytes, const std::string& source)
    : api_(sentencepiece_api()) {
  char error[kErrorCapacity] = {0};
  handle_ = api_.load(bytes.data(), bytes.size(), error, sizeof error);
  if (handle_ == nullptr) {
    throw_value_error("[t5-tokenizer] " + source + " is not a valid SentencePiece model (" +
                      std::to_string(bytes.size()) + " bytes): " + error);
  }
}

SentencePieceModel::~SentencePieceModel() {
  if (handle_ != nullptr) api_.free(handle_);
}

int32_t SentencePieceModel::piece_size() const { return api_.piece_size(handle_); }

std::string SentencePieceModel::id_to_piece(int32_t id) const {
  std::string out(64, '\0');
  int64_t n = api_.id_to_piece(handle_, id, out.data(), out.size());
  TORCH_CHECK(n >= 0, "[t5-tokenizer] SentencePiece failed on id ", id);
  if (static_cast<size_t>(n) > out.size()) {
    out.resize(n);
    n = api_.id_to_piece(handle_, id, out.data(), out.size());
  }
  out.resize(n);
  return out;
}

int32_t SentencePieceModel::piece_kind(int32_t id) const { return api_.piece_kind(handle_, id); }

std::vector<int32_t> SentencePieceModel::encode(const std::string& text) const {
  char error[kErrorCapacity] = {0};
  // A piece covers at least one byte, plus one for the dummy prefix.
  std::vector<int32_t> ids(text.size() + 2);
  const int64_t n = api_.encode(handle_, text.data(), text.size(), ids.data(), ids.size(), error,
                                sizeof error);
  TORCH_CHECK(n >= 0, "[t5-tokenizer] SentencePiece could not encode the text: ", error);
  if (static_cast<size_t>(n) > ids.size()) {
    ids.resize(n);
    api_.encode(handle_, text.data(), text.size(), ids.data(), ids.size(), error, sizeof error);
  }
  ids.resize(n);
  return ids;
}

std::string SentencePieceModel::decode(const std::vector<int32_t>& ids) const {
  char error[kErrorCapacity] = {0};
  std::string out(16 * ids.size() + 16, '\0');
  int64_t n = api_.decode(handle_, ids.data(), ids.size(), out.data(), out.size(), error, sizeof error);
  TORCH_CHECK(n >= 0, "[t5-tokenizer] SentencePiece could not decode the ids: ", error);
  if (static_cast<size_t>(n) > out.size()) {
    out.resize(n);
    n = api_.decode(handle_, ids.data(), ids.size(), out.data(), out.size(), error, sizeof error);
  }
  out.resize(n);
  return out;
}

std::string train_sentencepiece(const std::vector<std::pair<std::string, std::string>>& flags,
                                const std::vector<std::string>& sentences) {
  const auto& api = sentencepiece_api();
  std::vector<const char*> names, values, lines;
  for (const auto& [name, value] : flags) {
    names.push_back(name.c_str());
    values.push_back(value.c_str());
  }
  for (const auto& s : sentences) lines.push_back(s.c_str());
  remat_sp_blob* blob = nullptr;
  char error[kErrorCapacity] = {0};
  const int rc = api.train(names.data(), values.data(), names.size(), lines.data(), lines.size(),
                           &blob, error, sizeof error);
  TORCH_CHECK(rc == 0 && blob != nullptr, "[t5-tokenizer] SentencePiece training failed: ", error);
  std::string model(api.blob_data(blob), api.blob_size(blob));
  api.blob_free(blob);
  return model;
}

}  // namespace remat::encoders::detail
