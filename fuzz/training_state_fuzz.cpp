// Fuzz target: reading a training checkpoint to resume from. The first byte picks the file the
// input replaces in an otherwise valid checkpoint (state.json, or one of its safetensors files).
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "fuzz_input_file.h"
#include "remat/train/run/training_state.h"

namespace {

// A valid checkpoint to start from, written once per process.
const std::filesystem::path& valid_checkpoint() {
  static const std::filesystem::path dir = [] {
    const auto out = remat::fuzz::scratch_dir() / "valid";
    remat::train::TrainingCheckpoint c;
    c.position = {3, 0, 3};
    c.trainable = {{"layer.weight", torch::ones({2, 2})}};
    c.optimizer = {{"layer.weight.exp_avg", torch::zeros({2, 2})},
                   {"layer.weight.exp_avg_sq", torch::zeros({2, 2})},
                   {"layer.weight.step", torch::full({1}, 3.0)}};
    c.rng = {{"cpu", torch::zeros({16}, torch::kUInt8)}};
    c.facts = {{"seed", "1"}};
    return std::filesystem::path(remat::train::save_training_checkpoint(out.string(), c));
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* const kFiles[] = {"state.json", "trainable.safetensors", "optimizer.safetensors",
                                       "rng.safetensors"};
  const auto& valid = valid_checkpoint();
  const auto dir = remat::fuzz::scratch_dir() / "checkpoint-7";
  std::filesystem::remove_all(dir);
  std::filesystem::copy(valid, dir);
  remat::fuzz::write_input(data + 1, size - 1, kFiles[data[0] % 4], "checkpoint-7");
  try {
    remat::train::load_training_checkpoint(dir.string());
  } catch (const c10::Error&) {
  }
  return 0;
}
