// Whole-or-nothing file writes (remat/io/files.h): every small file remat writes beside data a
// reader may open at any moment (config.json, caption files, shard indexes).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "remat/error.h"
#include "remat/io/files.h"

namespace remat::io {

void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& component) {
  namespace fs = std::filesystem;
  const fs::path dest(path);
  const fs::path dir = dest.has_parent_path() ? dest.parent_path() : fs::path(".");
  // A dot name in the same directory keeps rename(2) atomic (same file system) and out of scans
  // that skip hidden files.
  std::string temp = (dir / ("." + dest.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) {
    throw_value_error("[" + component + "] cannot write '" + path + "': cannot create a temporary file: " +
                      std::strerror(errno));
  }
  const auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(temp.c_str());
    throw_value_error("[" + component + "] cannot write '" + path + "': " + what + ": " + reason);
  };
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write failed");
    p += n;
    left -= static_cast<size_t>(n);
  }
  ::fchmod(fd, 0644);  // mkstemp creates 0600; these files are read like any other
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temp.c_str());
    throw_value_error("[" + component + "] cannot write '" + path + "': close failed: " + reason);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temp.c_str());
    throw_value_error("[" + component + "] cannot write '" + path + "': rename failed: " + reason);
  }
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

}  // namespace remat::io
