// Fuzz target: the options of `remat train`, from a config.json (first byte even) or from a
// command line, one argument per line (first byte odd), through the whole validation.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "fuzz_input_file.h"
#include "remat/train/options/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const remat::train::Environment no_cuda(false);
  std::vector<std::string> warnings;
  try {
    if (data[0] % 2 == 0) {
      const std::string path = remat::fuzz::write_input(data + 1, size - 1, "config.json");
      remat::train::load_train_config({"--config", path}, warnings, no_cuda);
    } else {
      std::vector<std::string> args;
      std::string current;
      for (size_t i = 1; i < size; ++i) {
        if (data[i] == '\n') {
          args.push_back(current);
          current.clear();
        } else {
          current.push_back(static_cast<char>(data[i]));
        }
      }
      if (!current.empty()) args.push_back(current);
      remat::train::load_train_config(args, warnings, no_cuda);
    }
  } catch (const c10::Error&) {
    // Refused with a message (ValidationError and ValidationErrors are c10::ValueErrors).
  }
  return 0;
}
