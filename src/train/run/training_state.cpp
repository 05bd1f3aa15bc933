#include "remat/train/run/training_state.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <cctype>
#include <charconv>
#include <cstring>
#include <limits>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "remat/compat.h"
#include "remat/train/run/ema.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"

namespace remat::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrefix = "checkpoint-";
constexpr const char* kTmpPrefix = ".tmp-checkpoint-";  // save_training_checkpoint's work directory
constexpr const char* kOldPrefix = ".old-checkpoint-";  // a replaced checkpoint, until removed

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// The step of a directory named checkpoint-<digits>, nullopt for any other name. A step that
// int64 cannot hold is a named error (it was `stoll`'s out_of_range, exit 1).
std::optional<int64_t> checkpoint_step(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(std::strlen(kPrefix));
  if (!all_digits(digits)) return std::nullopt;
  int64_t step = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  TORCH_CHECK_VALUE(error == std::errc() && end == digits.data() + digits.size(), "[checkpoint] '",
                    dir.string(), "' is named like a checkpoint, but its step must be at most ",
                    std::numeric_limits<int64_t>::max(), "; rename or remove it");
  return step;
}

std::string unique_suffix() {
  std::random_device device;
  return std::to_string(device()) + std::to_string(device());
}

}  // namespace

std::string save_training_checkpoint(const std::string& output_dir,
                                     const TrainingCheckpoint& checkpoint) {
  const fs::path root(output_dir);
  fs::create_directories(root);
  const fs::path final_dir = root / (kPrefix + std::to_string(checkpoint.position.global_step));
  const fs::path tmp_dir = root / (".tmp-" + final_dir.filename().string() + "-" + unique_suffix());
  fs::create_directory(tmp_dir);
  try {
    io::save_safetensors((tmp_dir / "trainable.safetensors").string(), checkpoint.trainable);
    io::save_safetensors((tmp_dir / "optimizer.safetensors").string(), checkpoint.optimizer);
    io::save_safetensors((tmp_dir / "rng.safetensors").string(), checkpoint.rng);
    if (!checkpoint.ema.empty()) {
      fs::create_directory(tmp_dir / kEmaCheckpointFolder);
      io::save_safetensors((tmp_dir / kEmaCheckpointFolder / kEmaCheckpointFile).string(), checkpoint.ema,
                           checkpoint.ema_metadata);
    }
    nlohmann::json state{{"global_step", checkpoint.position.global_step},
                         {"epoch", checkpoint.position.epoch},
                         {"batch_in_epoch", checkpoint.position.batch_in_epoch},
                         {"facts", checkpoint.facts}};
    std::ofstream out(tmp_dir / "state.json");
    out << state.dump(2) << "\n";
    out.close();
    TORCH_CHECK(out.good(), "[checkpoint] could not write ", (tmp_dir / "state.json").string());
    // Replace an existing checkpoint of the same step: move it aside, move the new one in.
    if (fs::exists(final_dir)) {
      const fs::path old_dir = root / (".old-" + final_dir.filename().string() + "-" + unique_suffix());
      fs::rename(final_dir, old_dir);
      fs::rename(tmp_dir, final_dir);
      fs::remove_all(old_dir);
    } else {
      fs::rename(tmp_dir, final_dir);
    }
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp_dir, ignored);
    throw;
  }
  return final_dir.string();
}

TrainingCheckpoint load_training_checkpoint(const std::string& path) {
  const fs::path dir(path);
  std::error_code ec;
  TORCH_CHECK_VALUE(fs::is_directory(dir, ec), "[checkpoint] resume_from_checkpoint must be a checkpoint "
                    "directory (output_dir/checkpoint-<step>) or 'latest', got '", path, "'");
  TrainingCheckpoint checkpoint;
  checkpoint.position = read_training_position((dir / "state.json").string(), &checkpoint.facts);
  const auto read_all = [&](const char* file) {
    const auto st = io::SafetensorsFile::open((dir / file).string());
    std::vector<io::NamedTensor> tensors;
    for (const auto& name : st.names()) {
      tensors.emplace_back(name, st.tensor(name));
      io::require_finite(tensors.back().second, "checkpoint", st.path(), name);
    }
    return tensors;
  };
  checkpoint.trainable = read_all("trainable.safetensors");
  checkpoint.optimizer = read_all("optimizer.safetensors");
  checkpoint.rng = read_all("rng.safetensors");
  const fs::path ema = fs::path(kEmaCheckpointFolder) / kEmaCheckpointFile;
  if (fs::exists(dir / ema, ec)) {
    checkpoint.ema = read_all(ema.string().c_str());
    checkpoint.ema_metadata = io::SafetensorsFile::open((dir / ema).string()).metadata();
  }
  return checkpoint;
}

std::vector<std::string> list_training_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return {};
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    // An entry whose status cannot be read (a symlink loop) is not a checkpoint.
    std::error_code entry_ec;
    if (!entry.is_directory(entry_ec) || entry_ec) continue;
    if (auto step = checkpoint_step(entry.path())) found.emplace_back(*step, entry.path().string());
  }
  TORCH_CHECK_VALUE(!ec, "[checkpoint] cannot list output_dir '", output_dir, "': ", ec.message());
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [step, p] : found) paths.push_back(std::move(p));
  return paths;
}

std::vector<std::string> remove_stale_checkpoint_temporaries(const std::string& output_dir) {
  std::vector<std::string> done;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return done;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) stale.push_back(entry.path());
  for (const auto& path : stale) {
    const std::string name = path.filename().string();
    if (name.rfind(kTmpPrefix, 0) == 0) {
      // A save that never reached its rename: incomplete by construction.
      fs::remove_all(path, ec);
      if (!ec) done.push_back("removed " + path.string());
    } else if (name.rfind(kOldPrefix, 0) == 0) {
      // A replaced checkpoint (".old-checkpoint-<step>-<suffix>"): complete. If the save that
      // replaced it stopped before its own rename, it is the only copy of that step: put it back.
      const std::string rest = name.substr(std::strlen(kOldPrefix));
      const std::string step = rest.substr(0, rest.find('-'));
      if (!all_digits(step)) continue;  // not one of ours
      const fs::path final_dir = path.parent_path() / (kPrefix + step);
      if (!fs::exists(final_dir, ec)) {
        fs::rename(path, final_dir, ec);
        if (!ec) done.push_back("restored " + final_dir.string() + " from " + path.string());
      } else {
        fs::remove_all(path, ec);
        if (!ec) done.push_back("removed " + path.string());
      }
    }
  }
  return done;
}

std::optional<std::string> resolve_resume_path(const std::string& resume_from_checkpoint,
                                               const std::string& output_dir) {
  if (resume_from_checkpoint.empty()) return std::nullopt;
  if (resume_from_checkpoint == "latest") {
    const auto all = list_training_checkpoints(output_dir);
    if (all.empty()) return std::nullopt;
    return all.back();
  }
  std::error_code ec;
  TORCH_CHECK_VALUE(fs::is_directory(resume_from_checkpoint, ec),
                    "[checkpoint] resume_from_checkpoint must be 'latest' or an existing checkpoint "
                    "directory, got '", resume_from_checkpoint, "'");
  return resume_from_checkpoint;
}

std::vector<std::string> prune_training_checkpoints(const std::string& output_dir,
                                                    int64_t total_limit) {
  std::vector<std::string> removed;
  if (total_limit <= 0) return removed;
  auto all = list_training_checkpoints(output_dir);
  while (static_cast<int64_t>(all.size()) > total_limit) {
    // Renamed out of the way first (one atomic rename(2)), then deleted: a kill -9 during the
    // deletion leaves a temporary that the next run removes, never a checkpoint-N that still has
    // its state.json but lost its weights.
    const fs::path doomed = fs::path(all.front());
    const fs::path aside = doomed.parent_path() / (kTmpPrefix + ("pruned-" + doomed.filename().string()));
    std::error_code ec;
    fs::remove_all(aside, ec);  // left by an earlier kill
    fs::rename(doomed, aside, ec);
    TORCH_CHECK_VALUE(!ec, "[checkpoint] cannot move the old checkpoint '", doomed.string(), "' aside to delete it: ",
                      ec.message());
    fs::remove_all(aside, ec);
    removed.push_back(all.front());
    all.erase(all.begin());
  }
  return removed;
}

}  // namespace remat::train
