#pragma once
// Every tensor of a safetensors file by name, copied out of the mapping: what the training tests
// compare weights, checkpoints and adapters with.

#include <map>
#include <string>

#include <ATen/Tensor.h>

#include "remat/io/safetensors.h"

namespace remat::testing {

inline std::map<std::string, at::Tensor> read_tensors(const std::string& path) {
  const auto file = io::SafetensorsFile::open(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& name : file.names()) out[name] = file.tensor(name).clone();
  return out;
}

}  // namespace remat::testing
