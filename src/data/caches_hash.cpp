// Stable names and identities for the caches: FNV-1a 128 and the encoder components' identities.
#include <algorithm>
#include <filesystem>
#include <sstream>

#include "caches_internal.h"
#include "remat/util/files.h"

namespace remat::data::detail {
namespace fs = std::filesystem;

std::string fnv1a_128_hex(const std::string& bytes) {
  using u128 = unsigned __int128;
  const u128 prime = (u128{1} << 88) | u128{0x13b};
  u128 hash = (u128{0x6c62272e07bb0142ull} << 64) | u128{0x62b821756295c58dull};
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= prime;
  }
  static const char* digits = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 31; i >= 0; --i) {
    out[i] = digits[static_cast<unsigned>(hash & 0xf)];
    hash >>= 4;
  }
  return out;
}

std::string component_identity(const std::string& component_dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(component_dir)) {
    std::error_code ec;
    if (entry.is_regular_file(ec)) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::ostringstream key;
  for (const auto& file : files) {
    std::error_code ec;
    const auto size = fs::file_size(file, ec);
    const auto mtime = fs::last_write_time(file, ec).time_since_epoch().count();
    key << file.filename().string() << '\0' << size << '\0' << mtime << '\n';
  }
  const auto config = fs::path(component_dir) / "config.json";
  if (fs::is_regular_file(config)) key << util::read_regular_file(config.string(), 1 << 20, "caches", "config.json");
  return fnv1a_128_hex(key.str());
}

}  // namespace remat::data::detail
