// Regular-file checks before opening (remat/util/files.h).
#include "remat/util/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "remat/util/error.h"

namespace remat::util {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string prefix(const std::string& component, const std::string& what, const std::string& path) {
  return "[" + component + "] " + what + " must be a regular file, got '" + path + "'";
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& component,
                          const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw_value_error(prefix(component, what, path) + " (" + std::strerror(errno) + ")");
  }
  if (!S_ISREG(st.st_mode)) throw_value_error(prefix(component, what, path) + " (" + kind_of(st.st_mode) + ")");
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& component,
                              const std::string& what) {
  // O_NONBLOCK: opening a FIFO without a writer returns at once instead of blocking; fstat then
  // refuses it. On a regular file the flag changes nothing.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw_value_error("[" + component + "] cannot open " + what + " '" + path + "': " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw_value_error("[" + component + "] cannot stat " + what + " '" + path + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) throw_value_error(prefix(component, what, path) + " (" + kind_of(st.st_mode) + ")");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    throw_value_error("[" + component + "] " + what + " '" + path + "' is too large: " + std::to_string(size) +
                      " bytes, at most " + std::to_string(max_bytes));
  }
  std::string text(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, text.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw_value_error("[" + component + "] cannot read " + what + " '" + path + "': " + std::strerror(errno));
    }
    if (n == 0) break;  // the file shrank while we read it
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

std::string canonical_folder(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return fs::path(path).lexically_normal().string();
  fs::path resolved = fs::weakly_canonical(absolute, ec);
  if (ec) resolved = absolute.lexically_normal();
  std::string out = resolved.string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();  // "x/" and "x" are one folder
  return out;
}

void make_directories(const std::string& path, const std::string& component, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(path, ec);
  if (!ec && fs::is_directory(path, ec)) return;
  const std::string head = "[" + component + "] " + what + " '" + path + "' cannot be created: ";
  // The nearest part of the path that exists but is not a directory is the usual cause.
  for (fs::path p = fs::path(path).lexically_normal(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
    std::error_code e;
    const auto status = fs::status(p, e);
    if (!e && fs::exists(status) && !fs::is_directory(status)) {
      throw_value_error(head + "'" + p.string() + "' is a file, not a directory");
    }
    if (p.parent_path() == p) break;
  }
  throw_value_error(head + (ec ? ec.message() : std::string("it is not a directory")));
}

}  // namespace remat::util
