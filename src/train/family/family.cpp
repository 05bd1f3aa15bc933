// The model-family registry. The built-in families register themselves through the generated
// builtin_families.cpp (one call per file under families/), the first time the registry is used.
#include "remat/train/family/family.h"

#include <algorithm>
#include <mutex>

#include "remat/util/error.h"
#include "remat/train/options/config.h"

namespace remat::train {
namespace families {
void register_builtin();  // builtin_families.cpp, generated
}  // namespace families

namespace {

struct Registry {
  std::vector<std::unique_ptr<ModelFamily>> families;
  uint64_t generation = 0;
};

Registry& raw_registry() {
  static Registry r;
  return r;
}

// True while the built-in families register (their register_family calls must not wait for
// themselves).
bool registering_builtin = false;

// The registry with the built-in families in it.
Registry& registry() {
  static std::once_flag builtin;
  std::call_once(builtin, [] {
    registering_builtin = true;
    families::register_builtin();
    registering_builtin = false;
  });
  return raw_registry();
}

}  // namespace

std::string default_model_family() {
  // A family that builds a TrainConfig while it registers sees the families registered before it.
  const Registry& r = registering_builtin ? raw_registry() : registry();
  return r.families.empty() ? std::string() : r.families.front()->name;
}

std::string ModelFamily::lora_target(const TrainConfig& config) const {
  if (lora_target_of) return lora_target_of(config);
  return lora_target_presets.empty() ? std::string() : lora_target_presets.front();
}

const FlavourSpec* ModelFamily::flavour(const std::string& n) const {
  const auto alias = flavour_aliases.find(n);
  const std::string& wanted = alias != flavour_aliases.end() ? alias->second : n;
  for (const auto& f : flavour_specs) {
    if (f.name == wanted) return &f;
  }
  return nullptr;
}

std::string ModelFamily::preset_of(const std::string& n) const {
  if (const FlavourSpec* f = flavour(n)) return f->preset;
  for (const auto& f : flavour_specs) {
    if (f.preset == n) return f.preset;
  }
  std::string valid;
  for (const auto& f : flavour_specs) valid += (valid.empty() ? "" : ", ") + f.name;
  throw_value_error("[" + name + "] model_flavour must be one of " + valid + ", got '" + n + "'");
}

void register_family(ModelFamily family) {
  if (family.name.empty()) throw_value_error("[families] a family needs a name, got ''");
  if (family.flavour_specs.empty() || !family.build) {
    throw_value_error("[families] family '" + family.name + "' needs flavour_specs and a build function");
  }
  family.flavours.clear();
  for (const auto& f : family.flavour_specs) family.flavours.push_back(f.name);
  if (family.default_flavour.empty()) family.default_flavour = family.flavours.front();
  if (family.small_flavour.empty()) family.small_flavour = family.flavours.back();
  if (family.latents.family.empty()) family.latents.family = family.name;
  Registry& r = registering_builtin ? raw_registry() : registry();
  auto it = std::find_if(r.families.begin(), r.families.end(),
                         [&](const auto& f) { return f->name == family.name; });
  auto owned = std::make_unique<ModelFamily>(std::move(family));
  if (it != r.families.end()) *it = std::move(owned);
  else r.families.push_back(std::move(owned));
  ++r.generation;
}

std::vector<const ModelFamily*> model_families() {
  std::vector<const ModelFamily*> out;
  for (const auto& f : registry().families) out.push_back(f.get());
  return out;
}

const ModelFamily* find_model_family(const std::string& name) {
  for (const ModelFamily* f : model_families()) {
    if (f->name == name) return f;
  }
  return nullptr;
}

std::vector<std::string> model_family_names() {
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families()) names.push_back(f->name);
  return names;
}

const ModelFamily& model_family(const std::string& name) {
  if (const ModelFamily* f = find_model_family(name)) return *f;
  std::string valid;
  for (const auto& n : model_family_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw_value_error("[train] model_family must be one of " + valid + ", got '" + name + "'");
}

uint64_t model_family_generation() { return registry().generation; }

}  // namespace remat::train
