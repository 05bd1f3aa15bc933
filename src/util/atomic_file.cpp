// Whole-or-nothing file writes (remat/util/files.h): every file remat writes beside data a reader
// may open at any moment (config.json, caption files, shard indexes, safetensors files, pictures).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <c10/util/Exception.h>

#include "remat/util/error.h"
#include "remat/util/files.h"

namespace remat::util {

AtomicFile::AtomicFile(const std::string& destination, const std::string& component)
    : destination_(destination), component_(component) {
  namespace fs = std::filesystem;
  const fs::path dest(destination);
  const fs::path dir = dest.has_parent_path() ? dest.parent_path() : fs::path(".");
  temporary_ = (dir / ("." + dest.filename().string() + ".tmp.XXXXXX")).string();
  fd_ = ::mkstemp(temporary_.data());
  if (fd_ < 0) {
    const int error = errno;
    temporary_.clear();
    fail("cannot create a temporary file in '" + dir.string() + "'", error);
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temporary_.empty()) ::unlink(temporary_.c_str());
}

void AtomicFile::fail(const std::string& step, int error) {
  throw_value_error("[" + component_ + "] cannot write '" + destination_ + "': " + step + ": " + std::strerror(error));
}

void AtomicFile::write(const void* data, size_t size) {
  TORCH_CHECK(fd_ >= 0 && !committed_, "AtomicFile::write after commit");
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    // Linux caps one write at ~2 GiB; partial writes and signals are retried.
    const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write failed", n < 0 ? errno : EIO);
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  TORCH_CHECK(fd_ >= 0 && !committed_, "AtomicFile::commit called twice");
  ::fchmod(fd_, 0644);  // mkstemp creates 0600; these files are read like any other
  if (::fsync(fd_) != 0) fail("fsync failed", errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("close failed", errno);
  if (::rename(temporary_.c_str(), destination_.c_str()) != 0) fail("rename failed", errno);
  committed_ = true;
}

void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& component) {
  AtomicFile file(path, component);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path dest(path);
  const fs::path dir = dest.has_parent_path() ? dest.parent_path() : fs::path(".");
  const std::string prefix = "." + dest.filename().string() + ".tmp.";
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // Exactly write_file_atomically's names for this destination: the prefix and mkstemp's six.
    if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) continue;
    std::error_code e;
    if (entry.is_regular_file(e) && fs::remove(entry.path(), e)) removed.push_back(entry.path().string());
  }
  return removed;
}

}  // namespace remat::util
