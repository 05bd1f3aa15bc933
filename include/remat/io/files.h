#pragma once
/// \file
/// Opening files named by users without trusting them: a path given as --weights, --config or in
/// a config file may name a FIFO (open(2) would block until a writer appears), a directory, a
/// device, a symlink loop or a file far larger than the format allows. These checks come before
/// any read, and each failure is a c10::ValueError naming the component, the path and the reason.

#include <cstdint>
#include <string>

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

}  // namespace remat::io
