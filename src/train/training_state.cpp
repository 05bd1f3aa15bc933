#include "remat/train/training_state.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "remat/compat.h"

namespace remat::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrefix = "checkpoint-";

std::optional<int64_t> checkpoint_step(const fs::path& dir) {
  static const std::regex pattern("checkpoint-([0-9]+)");
  std::smatch match;
  const std::string name = dir.filename().string();
  if (!std::regex_match(name, match, pattern)) return std::nullopt;
  return std::stoll(match[1].str());
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
  TORCH_CHECK_VALUE(fs::is_directory(dir), "[checkpoint] resume_from_checkpoint must be a checkpoint "
                    "directory (output_dir/checkpoint-<step>) or 'latest', got '", path, "'");
  TrainingCheckpoint checkpoint;
  const auto read_all = [&](const char* file) {
    const auto st = io::SafetensorsFile::open((dir / file).string());
    std::vector<io::NamedTensor> tensors;
    for (const auto& name : st.names()) tensors.emplace_back(name, st.tensor(name));
    return tensors;
  };
  checkpoint.trainable = read_all("trainable.safetensors");
  checkpoint.optimizer = read_all("optimizer.safetensors");
  checkpoint.rng = read_all("rng.safetensors");
  const fs::path state_path = dir / "state.json";
  std::ifstream in(state_path);
  TORCH_CHECK_VALUE(in.good(), "[checkpoint] missing ", state_path.string());
  nlohmann::json state;
  try {
    in >> state;
    checkpoint.position.global_step = state.at("global_step").get<int64_t>();
    checkpoint.position.epoch = state.at("epoch").get<int64_t>();
    checkpoint.position.batch_in_epoch = state.at("batch_in_epoch").get<int64_t>();
    checkpoint.facts = state.value("facts", std::map<std::string, std::string>{});
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, "[checkpoint] ", state_path.string(), " is not a valid state file: ", e.what());
  }
  return checkpoint;
}

std::vector<std::string> list_training_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return {};
  for (const auto& entry : fs::directory_iterator(output_dir)) {
    if (!entry.is_directory()) continue;
    if (auto step = checkpoint_step(entry.path())) found.emplace_back(*step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [step, p] : found) paths.push_back(std::move(p));
  return paths;
}

std::optional<std::string> resolve_resume_path(const std::string& resume_from_checkpoint,
                                               const std::string& output_dir) {
  if (resume_from_checkpoint.empty()) return std::nullopt;
  if (resume_from_checkpoint == "latest") {
    const auto all = list_training_checkpoints(output_dir);
    if (all.empty()) return std::nullopt;
    return all.back();
  }
  TORCH_CHECK_VALUE(fs::is_directory(resume_from_checkpoint),
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
    fs::remove_all(all.front());
    removed.push_back(all.front());
    all.erase(all.begin());
  }
  return removed;
}

}  // namespace remat::train
