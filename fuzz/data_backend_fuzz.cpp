// Fuzz target: SimpleTuner's multidatabackend.json as `remat train --data_backend_config` reads it
// (remat/data/dataset_config.h): every backend, key and value checked before any folder is read.
#include <cstddef>
#include <cstdint>
#include <string>

#include <c10/util/Exception.h>

#include "fuzz_input_file.h"
#include "remat/data/dataset_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = remat::fuzz::write_input(data, size, "multidatabackend.json");
  remat::data::DataDefaults defaults;
  defaults.model_family = "fuzz";  // names the default cache folders, as a run's family does
  try {
    remat::data::read_data_backend_config(path, defaults);
  } catch (const c10::Error&) {
    // Refused with a message naming the backend, key and value.
  }
  return 0;
}
