#pragma once
// Read-only memory mapping of a whole file (POSIX mmap). Private to remat::io.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace remat::io::detail {

/// A file mapped into memory for reading. The mapping is MAP_PRIVATE with PROT_READ|PROT_WRITE:
/// the file is opened read-only and never modified, but a caller that writes into a zero-copy
/// tensor gets copy-on-write pages instead of a segmentation fault. Shared through shared_ptr so
/// that tensors viewing the mapping keep it alive.
class MappedFile {
 public:
  /// Maps `path`. Throws c10::Error naming the path and the errno text when the file cannot be
  /// opened, stat'ed or mapped. An empty file is represented without a mapping (size() == 0).
  static std::shared_ptr<const MappedFile> open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, uint8_t* data, uint64_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  uint8_t* data_;
  uint64_t size_;
};

}  // namespace remat::io::detail
