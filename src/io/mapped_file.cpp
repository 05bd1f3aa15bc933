#include "mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <c10/util/Exception.h>

namespace remat::io::detail {

namespace {

// Closes the descriptor on every path out of open(); the mapping stays valid after close.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO without a writer would block open(2) forever; with the flag it opens at
  // once and the S_ISREG check below refuses it. Regular files ignore the flag.
  FdGuard guard{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  TORCH_CHECK(guard.fd >= 0, "[safetensors] cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  TORCH_CHECK(::fstat(guard.fd, &st) == 0, "[safetensors] cannot stat '", path,
              "': ", std::strerror(errno));
  TORCH_CHECK(S_ISREG(st.st_mode), "[safetensors] '", path, "' is not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    // mmap rejects a zero length; the header check reports the empty file as truncated.
    return std::shared_ptr<const MappedFile>(new MappedFile(path, nullptr, 0));
  }
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, guard.fd, 0);
  TORCH_CHECK(addr != MAP_FAILED, "[safetensors] cannot mmap '", path, "' (", size,
              " bytes): ", std::strerror(errno));
  return std::shared_ptr<const MappedFile>(new MappedFile(path, static_cast<uint8_t*>(addr), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace remat::io::detail
