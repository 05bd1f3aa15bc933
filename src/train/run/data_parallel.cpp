// Data-parallel helpers of the trainer (data_parallel.h).
#include "run/data_parallel.h"

#include <sstream>

#include "remat/train/options/options.h"

namespace remat::train {
namespace {

// SplitMix64's finaliser: every input bit affects every output bit.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t batch_noise_seed(int64_t seed, int64_t epoch, int64_t index) {
  return mix(mix(mix(static_cast<uint64_t>(seed)) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(index));
}

std::string canonical_config_text(const TrainConfig& config) {
  std::ostringstream out;
  for (const auto& spec : option_specs()) {
    if (!spec.render) continue;
    out << spec.name << "=" << spec.render(config).value_or("(unset)") << "\n";
  }
  return out.str();
}

}  // namespace remat::train
