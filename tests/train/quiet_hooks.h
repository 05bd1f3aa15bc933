#pragma once
// Trainer hooks that print nothing: these tests read the trainer's results, not its log.

#include <cstdio>
#include <string>

#include "remat/train/run/trainer.h"

namespace remat::testing {

inline train::TrainerHooks quiet_hooks() {
  static std::FILE* const null_stream = std::fopen("/dev/null", "w");  // one for the test binary
  train::TrainerHooks hooks;
  hooks.log = [](const std::string&) {};
  hooks.progress_stream = null_stream;
  return hooks;
}

}  // namespace remat::testing
