#pragma once
/// \file
/// Opening files named by users without trusting them: a path given as --weights, --config or in
/// a config file may name a FIFO (open(2) would block until a writer appears), a directory, a
/// device, a symlink loop or a file far larger than the format allows. These checks come before
/// any read, and each failure is a c10::ValueError naming the component, the path and the reason.

#include <cstdint>
#include <cstddef>
#include <string>
#include <vector>

#include "remat/export.h"

namespace remat::util {

/// Throws c10::ValueError unless `path` (symlinks followed) is an existing regular file:
/// "[<component>] <what> must be a regular file, got '<path>' (a FIFO)" and likewise for a
/// directory, a device, a socket, a missing path or a symlink loop. Never opens the file.
REMAT_API void require_regular_file(const std::string& path, const std::string& component,
                                    const std::string& what);

/// The whole content of the regular file `path`, at most `max_bytes` long. The file is opened
/// with O_NONBLOCK and checked with fstat before any read, so a FIFO never blocks. Throws
/// c10::ValueError naming `component`, `what` and the path for a missing, unreadable, non-regular
/// or too large file.
REMAT_API std::string read_regular_file(const std::string& path, uint64_t max_bytes,
                                        const std::string& component, const std::string& what);

/// The one whole-or-nothing writer: a temporary file beside `destination` (".<name>.tmp.XXXXXX",
/// same directory, so rename(2) is atomic and directory scans that skip hidden files skip it),
/// written in pieces, then commit(): mode 0644, fsync, close, rename over `destination`. A reader
/// sees the old file or the whole new one, never a half-written one. Destroyed before commit()
/// (an exception, a failed check) it closes and removes the temporary file. Every failure throws
/// c10::ValueError "[component] cannot write 'destination': <step>: <reason>".
class REMAT_API AtomicFile {
 public:
  AtomicFile(const std::string& destination, const std::string& component);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends `size` bytes (any size: written in pieces the kernel accepts, EINTR retried).
  void write(const void* data, size_t size);
  /// Makes the file durable and visible under `destination`. At most once.
  void commit();

 private:
  [[noreturn]] void fail(const std::string& step, int error);

  std::string destination_;
  std::string component_;
  std::string temporary_;
  int fd_ = -1;
  bool committed_ = false;
};

/// Writes `bytes` to `path` through AtomicFile: the old file or the whole new one.
REMAT_API void write_file_atomically(const std::string& path, const std::string& bytes,
                                     const std::string& component);

/// Removes the temporaries write_file_atomically(path, ...) leaves when its process is killed
/// before the rename (".<name>.tmp.XXXXXX" beside `path`), and returns their paths. A writer calls
/// it before writing `path` again; a second process writing the same path at the same moment
/// would race on the result anyway.
REMAT_API std::vector<std::string> remove_stale_temporaries(const std::string& path);

/// `path` as the folder it resolves to: absolute, symlinks resolved as far as the path exists,
/// "." and ".." removed (std::filesystem::weakly_canonical). Two spellings of one folder ("x/.",
/// "a/../x", a symlink to x) give the same string; a path that cannot be resolved (a symlink loop)
/// is returned lexically normalised.
REMAT_API std::string canonical_folder(const std::string& path);

/// Creates the directory `path` and its missing parents (an existing directory is fine). Throws
/// c10::ValueError "[<component>] <what> '<path>' cannot be created: '<ancestor>' is a file, not a
/// directory" (or the system's reason) instead of std::filesystem's raw error.
REMAT_API void make_directories(const std::string& path, const std::string& component, const std::string& what);

}  // namespace remat::util
