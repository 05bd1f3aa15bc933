// The built-in saved-input policies. The storage itself is src/core/detail/offload.cpp
// (SavedInputs); these objects name it and state its costs.
#include "remat/saved_inputs.h"

#include <memory>

#include "remat/util/error.h"

namespace remat {
namespace {

// "torch": inputs stay where they are.
class KeepOnDevice final : public SavedInputPolicy {
 public:
  std::string name() const override { return "torch"; }
  std::string description() const override { return "keep the saved block inputs on the device"; }
  Backend backend() const override { return Backend::Recompute; }
  int64_t device_bytes_held(int64_t input_bytes, bool) const override { return input_bytes; }
  int64_t bytes_moved(int64_t, bool) const override { return 0; }
};

// "unsloth": GPU inputs go to pinned host memory and come back for recomputation; CPU inputs
// have nowhere to go and stay, costing what "torch" costs.
class OffloadToPinnedHost final : public SavedInputPolicy {
 public:
  std::string name() const override { return "unsloth"; }
  std::string description() const override {
    return "offload the saved block inputs to pinned host memory (GPU)";
  }
  Backend backend() const override { return Backend::Offload; }
  int64_t device_bytes_held(int64_t input_bytes, bool accelerator) const override {
    return accelerator ? 0 : input_bytes;
  }
  int64_t bytes_moved(int64_t input_bytes, bool accelerator) const override {
    return accelerator ? 2 * input_bytes : 0;
  }
};

const std::vector<std::unique_ptr<SavedInputPolicy>>& policies() {
  static const auto table = [] {
    std::vector<std::unique_ptr<SavedInputPolicy>> t;
    t.push_back(std::make_unique<KeepOnDevice>());
    t.push_back(std::make_unique<OffloadToPinnedHost>());
    return t;
  }();
  return table;
}

}  // namespace

const SavedInputPolicy& saved_input_policy(Backend backend) {
  for (const auto& p : policies()) {
    if (p->backend() == backend) return *p;
  }
  throw_value_error("[checkpoint] no saved-input policy runs backend " +
                    std::to_string(static_cast<int>(backend)));
}

const SavedInputPolicy& saved_input_policy(const std::string& name) {
  std::string valid;
  for (const auto& p : policies()) {
    if (p->name() == name) return *p;
    valid += (valid.empty() ? "" : ", ") + p->name();
  }
  throw_value_error("[checkpoint] backend must be one of " + valid + ", got '" + name + "'");
}

std::vector<std::string> saved_input_policy_names() {
  std::vector<std::string> names;
  for (const auto& p : policies()) names.push_back(p->name());
  return names;
}

}  // namespace remat
