#pragma once
/// \file
/// Opening files named by users without trusting them: a path given as --weights, --config or in
/// a config file may name a FIFO (open(2) would block until a writer appears), a directory, a
/// device, a symlink loop or a file far larger than the format allows. These checks come before
/// any read, and each failure is a c10::ValueError naming the component, the path and the reason.

#include <cstdint>
#include <string>
#include <vector>

#include "remat/export.h"

namespace remat::io {

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

/// Writes `bytes` to `path` so that a reader sees the old file or the whole new one, never a
/// half-written one: a temporary file in the same directory, fsync, rename(2). The file gets mode
/// 0644. Throws c10::ValueError naming `component` and the path when any step fails (the temporary
/// file is removed).
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

}  // namespace remat::io
