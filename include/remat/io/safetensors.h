#pragma once
/// \file
/// Reading and writing safetensors files (the format of every published Flux / MageFlow
/// checkpoint), and loading them into a torch::nn::Module.
///
/// Format: 8-byte little-endian u64 header length N, then N bytes of JSON
/// `{"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
///   "__metadata__": {"key": "value"}}`, then the data buffer. Offsets are relative to the start
/// of the data buffer; tensors are C-contiguous and little-endian.
///
/// Reading maps the file (mmap) instead of reading it, so a 24 GB checkpoint is never held twice:
/// `SafetensorsFile::view` returns tensors that point into the mapping, and
/// `load_state_dict_into` copies from the mapping straight into the parameters.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "remat/export.h"

namespace remat::io {

namespace detail {
class MappedFile;
}

/// The dtype names of the format that remat reads and writes, with their LibTorch types:
/// BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64. (The format also has U16/U32/U64 and
/// float8 types, which LibTorch 1.13 cannot represent; files using them are rejected by name.)
REMAT_API const std::vector<std::string>& supported_dtype_names();

/// The format's name for `dtype` ("F32" for at::kFloat ...). Throws c10::Error naming the dtype
/// and the supported list for a type the format cannot hold (complex, quantized ...).
REMAT_API std::string dtype_name(at::ScalarType dtype);

/// The LibTorch type for a format dtype name. Throws c10::Error naming the name and listing the
/// supported ones.
REMAT_API at::ScalarType dtype_from_name(const std::string& name);

/// Where one tensor lives in a file.
struct TensorInfo {
  at::ScalarType dtype;        ///< stored dtype
  std::vector<int64_t> shape;  ///< stored shape (C-contiguous); empty for a scalar
  uint64_t begin = 0;          ///< first byte, relative to the start of the data buffer
  uint64_t end = 0;            ///< one past the last byte, relative to the data buffer

  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

/// An open safetensors file, memory-mapped read-only.
///
/// `open` validates the whole header before returning (every dtype, shape and offset range), so
/// later accesses cannot fail on a malformed entry. Cheap to copy: copies share the mapping.
/// The mapping is private copy-on-write: the file is never written, and writing into a view only
/// changes this process's pages. The file must not be truncated by another process while it is
/// mapped (that is SIGBUS on any mmap reader); replacing it with rename(2), as save_safetensors
/// does, is safe.
/// Throws c10::ValueError "[<component>] '<file>': tensor '<name>' holds N non-finite values (NaN
/// or inf), the first at flat index I" unless every element of `tensor` is finite (integer and
/// bool tensors always are). Weights, LoRAs and checkpoints are checked when loaded: a NaN that
/// gets in turns every later number NaN, and its source is then nowhere to be seen.
REMAT_API void require_finite(const at::Tensor& tensor, const std::string& component, const std::string& file,
                              const std::string& name);

class REMAT_API SafetensorsFile {
 public:
  /// Maps and validates `path`. Throws c10::Error naming the path and the problem: missing or
  /// unreadable file (errno text), not a regular file (a FIFO is refused without blocking),
  /// truncated file, header length past the end of the file, a header larger than 100 MB or
  /// nesting deeper than 64 levels (remat/util/bounded_json.h), header not valid JSON or not an
  /// object, entry missing `dtype`/`shape`/`data_offsets`, unknown dtype (with the supported
  /// list), negative dimension, begin > end, range outside the data buffer, range size not equal
  /// to numel x element size (overflow-checked), non-string metadata; and unless the ranges,
  /// sorted, tile the data buffer exactly (no gap, no overlap, no trailing byte), as the
  /// reference reader requires: a header length one byte short, appended bytes and aliased
  /// ranges are errors (Note [Exact data section] in src/io/safetensors.cpp).
  static SafetensorsFile open(const std::string& path);

  /// The path given to open().
  const std::string& path() const { return path_; }

  /// Tensor names in the order the header lists them (`__metadata__` excluded).
  const std::vector<std::string>& names() const { return names_; }

  /// Whether the file holds a tensor called `name`.
  bool contains(const std::string& name) const { return index_.count(name) != 0; }

  /// Dtype, shape and byte range of `name`. Throws c10::Error naming the file and the key if the
  /// file has no such tensor.
  const TensorInfo& info(const std::string& name) const;

  /// The string-to-string `__metadata__` map (empty if the header has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// Size of the data buffer in bytes (file size minus 8 minus the header length).
  uint64_t data_size() const { return data_size_; }

  /// Zero-copy CPU tensor in the stored dtype and shape, pointing into the mapping. It keeps the
  /// mapping alive on its own: it stays valid after every SafetensorsFile copy is destroyed.
  /// Writes to it are private to the process (copy-on-write). If the tensor's bytes are not
  /// aligned to its element size (possible in files from other writers) it is copied instead, so
  /// every kernel may assume natural alignment.
  at::Tensor view(const std::string& name) const;

  /// Owning CPU copy of `name` in its stored dtype.
  at::Tensor tensor(const std::string& name) const;

  /// Owning CPU copy of `name` converted to `target` (as Tensor::to(target) converts), in one
  /// pass from the mapping.
  at::Tensor tensor(const std::string& name, at::ScalarType target) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<const detail::MappedFile> mapping_;
  const uint8_t* data_begin_ = nullptr;  // start of the data buffer inside the mapping
  uint64_t data_size_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, size_t> index_;  // name -> position in infos_
  std::vector<TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

/// One named tensor to write.
using NamedTensor = std::pair<std::string, at::Tensor>;

/// Writes `entries` and `metadata` to `path` in the safetensors format.
///
/// Layout: tensors are ordered like the reference (Rust) writer orders them: by dtype, widest
/// first (I64, F64, F32, I32, BF16, F16, I16, I8, U8, BOOL), then by name. The order of
/// `entries` therefore does not matter, the output is deterministic, and every tensor starts at
/// an offset aligned to its element size. The header lists `__metadata__` first (only when
/// `metadata` is non-empty, keys sorted), then the tensors in data order, as compact JSON padded
/// with spaces to a multiple of 8 bytes.
///
/// Tensors may live on any device and need not be contiguous: each is detached, moved to CPU and
/// made contiguous one at a time (so at most one extra tensor is held). Checks come first (names
/// non-empty, unique and not `__metadata__`; dtypes supported; tensors defined), then the file is
/// written to a temporary file in the same directory, flushed with fsync and renamed over
/// `path`. On any error `path` is left as it was, the temporary file is removed, and c10::Error
/// names the path and the problem.
REMAT_API void save_safetensors(const std::string& path, const std::vector<NamedTensor>& entries,
                                const std::map<std::string, std::string>& metadata = {});

/// The named parameters and buffers of `module` (recursively, with dotted names), as
/// save_safetensors and load_state_dict_into see them.
REMAT_API std::vector<NamedTensor> module_state(const torch::nn::Module& module);

/// Writes module_state(module) with save_safetensors.
REMAT_API void save_module(const std::string& path, const torch::nn::Module& module,
                           const std::map<std::string, std::string>& metadata = {});

/// How file keys are matched to module keys by load_state_dict_into.
struct LoadOptions {
  /// Strict: any missing, unexpected or shape-mismatched key is an error and nothing is copied.
  /// Non-strict: every matching key is copied and the problems are returned in the report.
  bool strict = true;
  /// Keys for which this returns false are ignored entirely (neither loaded nor unexpected). It
  /// sees the key as written in the file. Unset: every key is considered.
  std::function<bool(const std::string&)> key_filter;
  /// Removed from the front of every file key before matching (e.g. "transformer."). A
  /// considered key that does not start with it is reported as unexpected.
  std::string strip_prefix;
  /// Prepended to every file key (after strip_prefix) before matching.
  std::string add_prefix;
};

/// A file tensor whose shape differs from the module tensor of the same name.
struct ShapeMismatch {
  std::string key;                   ///< module key
  std::vector<int64_t> file_shape;   ///< shape in the file
  std::vector<int64_t> module_shape; ///< shape of the parameter/buffer
};

/// What load_state_dict_into did.
struct LoadReport {
  std::vector<std::string> loaded;      ///< module keys copied from the file(s), sorted
  std::vector<std::string> missing;     ///< module keys no file provides, sorted
  std::vector<std::string> unexpected;  ///< file keys (as written in the file) with no module key, sorted
  std::vector<ShapeMismatch> mismatched;  ///< sorted by key; not copied
  std::vector<std::string> skipped;     ///< file keys rejected by key_filter, sorted

  /// No missing, unexpected or mismatched key.
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  /// Human-readable list of every problem, one per line (empty string when ok()).
  std::string describe() const;
};

/// Copies tensors from `files` (e.g. the shards of one checkpoint) into the module's
/// named_parameters() and named_buffers(), under NoGradGuard, converting each to the dtype and
/// device of its destination (Tensor::copy_ semantics) straight from the mapping.
///
/// Strict mode (default) first checks every key and throws one c10::Error listing every missing
/// key, every unexpected key and every shape mismatch (file shape and module shape); the module
/// is then untouched. Non-strict mode copies what matches and returns the problems. A key present
/// in two files is an error in both modes.
REMAT_API LoadReport load_state_dict_into(torch::nn::Module& module,
                                          const std::vector<SafetensorsFile>& files,
                                          const LoadOptions& options = {});

/// Single-file form of the above.
REMAT_API LoadReport load_state_dict_into(torch::nn::Module& module, const SafetensorsFile& file,
                                          const LoadOptions& options = {});

/// Opens `path` and loads it (see above).
REMAT_API LoadReport load_state_dict_into(torch::nn::Module& module, const std::string& path,
                                          const LoadOptions& options = {});

}  // namespace remat::io
