#pragma once
// Writing a small text file (config.json, a shard index) so that a reader sees the old file or
// the new one, never a half-written one: a temporary file in the same directory, fsync, rename(2).

#include <string>

namespace remat::encoders {

/// Writes `text` to `path` atomically. Throws c10::ValueError naming `component` and the path.
void write_text_file_atomically(const std::string& path, const std::string& text, const std::string& component);

}  // namespace remat::encoders
