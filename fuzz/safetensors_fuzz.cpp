// Fuzz target: the safetensors reader, as every weights, sample and checkpoint file goes through it.
// Any input must either read back as tensors or be refused with a c10::Error naming the problem.
#include <cstddef>
#include <cstdint>

#include <c10/util/Exception.h>

#include "fuzz_input_file.h"
#include "remat/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = remat::fuzz::write_input(data, size, "input.safetensors");
  try {
    const auto file = remat::io::SafetensorsFile::open(path);
    for (const auto& name : file.names()) {
      const auto& info = file.info(name);
      (void)info;
      const at::Tensor t = file.tensor(name);
      if (t.numel() > 0) (void)t.sum();  // touch every byte the header claims
    }
    (void)file.metadata();
  } catch (const c10::Error&) {
    // A refusal with a message is the expected outcome for malformed input.
  }
  return 0;
}
