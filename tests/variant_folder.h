#pragma once
// Test helper: a pipeline folder in a weights variant's file names.
#include <filesystem>
#include <string>

namespace remat::testing {

// A copy of pipeline folder `from` whose components hold only `variant`'s files, as the hub's
// variant uploads name them (diffusers' _add_variant): every weights file and shard index renamed.
inline void copy_as_variant(const std::string& from, const std::string& to, const std::string& variant) {
  namespace fs = std::filesystem;
  fs::copy(from, to, fs::copy_options::recursive);
  for (const auto& entry : fs::recursive_directory_iterator(to)) {
    const std::string name = entry.path().filename().string();
    for (const std::string base : {"diffusion_pytorch_model", "model"}) {
      std::string renamed;
      if (name == base + ".safetensors") renamed = base + "." + variant + ".safetensors";
      if (name == base + ".safetensors.index.json") renamed = base + ".safetensors.index." + variant + ".json";
      if (!renamed.empty()) fs::rename(entry.path(), entry.path().parent_path() / renamed);
    }
  }
}

}  // namespace remat::testing
