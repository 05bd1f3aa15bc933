#pragma once
// Fuzz inputs reach remat the way users' data does: as files. One scratch directory per process
// (under /dev/shm when it exists, so each input costs no disk I/O).

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace remat::fuzz {

inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path base =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    auto d = base / ("remat-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

/// Writes `size` bytes to `name` in the scratch directory (or in `dir` below it) and returns the path.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& name,
                               const std::string& dir = "") {
  std::filesystem::path folder = scratch_dir() / dir;
  std::filesystem::create_directories(folder);
  const auto path = folder / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path.string();
}

}  // namespace remat::fuzz
