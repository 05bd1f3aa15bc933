// Fuzz target: a latent-cache dataset of one sample file (the first byte picks the family's
// layout), opened and read as training reads it.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include <c10/util/Exception.h>

#include "fuzz_input_file.h"
#include "remat/train/data/data.h"
#include "remat/train/family/family.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto names = remat::train::model_family_names();
  const auto& layout = remat::train::model_family(names[data[0] % names.size()]).latents;
  std::filesystem::remove_all(remat::fuzz::scratch_dir() / "data");
  remat::fuzz::write_input(data + 1, size - 1, "sample_000000.safetensors", "data");
  try {
    const auto dataset =
        remat::train::LatentDataset::open((remat::fuzz::scratch_dir() / "data").string(), layout);
    for (const auto& batch : dataset.epoch_batches(0, 0, 1)) (void)dataset.get_batch(batch);
  } catch (const c10::Error&) {
  }
  return 0;
}
