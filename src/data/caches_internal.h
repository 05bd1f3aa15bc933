#pragma once
// Private pieces of the caching phase (remat/data/caches.h): the stable hash that names text
// entries, the encoders' identities, the metadata every entry carries and the test of whether an
// entry on disk is still current, and the progress display.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "remat/data/image_dataset.h"

namespace remat::data::detail {

using Metadata = std::map<std::string, std::string>;

/// FNV-1a with the 128-bit parameters (offset basis 0x6c62272e07bb014262b821756295c58d, prime
/// 2^88 + 2^8 + 0x3b) over `bytes`, as 32 lowercase hex digits. Stable across machines and
/// versions: it names cache files.
std::string fnv1a_128_hex(const std::string& bytes);

/// The identity of one component directory: a hash of every regular file directly inside it
/// (sorted by name) with its size and modification time, and the bytes of its config.json. New
/// weights or a changed config give a new identity, so every entry made with the old one is stale.
std::string component_identity(const std::string& component_dir);

/// What an image entry's metadata must say to be current.
Metadata image_entry_metadata(const ImageRecord& record, const std::string& encoder_identity);
/// What a caption entry's metadata must say to be current (the caption itself included, so a
/// hash collision can never hand one caption another's embeddings).
Metadata text_entry_metadata(const std::string& caption, const std::string& encoder_identity);

/// Where the entry of `caption` lives in `dir`: <fnv1a_128_hex(identity NUL caption)>.safetensors.
std::string text_entry_path(const std::string& dir, const std::string& caption, const std::string& encoder_identity);
/// Where the latents of `record` live: <dir>/<relative path>.safetensors.
std::string image_entry_path(const std::string& dir, const ImageRecord& record);

/// Whether `path` is a whole safetensors file holding every key of `keys` whose metadata has
/// every (key, value) of `expected`. A missing, truncated or foreign file is not current.
bool entry_is_current(const std::string& path, const Metadata& expected, const std::vector<std::string>& keys);

/// Removes the temporary files an interrupted save left in `dir` (recursively):
/// `.<name>.tmp.XXXXXX`, as io::save_safetensors names them. Returns how many.
int64_t remove_interrupted_writes(const std::string& dir);

/// Progress of one phase: on a terminal one redrawn line with a bar, rate and ETA; otherwise a
/// plain line through `log` about every tenth of the work and at the end.
class CacheProgress {
 public:
  CacheProgress(std::string label, std::string unit, int64_t total, bool terminal,
                std::function<void(const std::string&)> log);
  void advance();  ///< one more item done
  void finish();   ///< ends the redrawn line; prints the final plain line if not yet printed
  double elapsed_seconds() const;

 private:
  std::string line() const;
  std::string label_, unit_;
  int64_t total_, done_ = 0, last_logged_ = -1;
  bool terminal_;
  std::function<void(const std::string&)> log_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace remat::data::detail
