#include "remat/models/lora.h"
#include "string_helpers.h"
#include "remat/util/error.h"

#include <stdexcept>

#include <torch/torch.h>

#include "remat/models/layers.h"

namespace remat::models {

namespace {

using remat::detail::join;

bool is_lora_key(const std::string& name) {
  return name.find("lora_A.") != std::string::npos || name.find("lora_B.") != std::string::npos;
}

}  // namespace

// SimpleTuner flux/model.py flux_lora_target lists (fused-projection names dropped).
std::vector<std::string> flux_lora_target_modules(const std::string& name) {
  const std::vector<std::string> base = {"to_k", "to_q", "to_v", "to_out.0"};
  const std::vector<std::string> context = {"add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"};
  const std::vector<std::string> ffs = {"ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                                        "ff_context.net.2", "proj_mlp", "proj_out"};
  auto concat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const auto all = concat(base, context);
  const auto all_ffs = concat(all, ffs);
  if (name == "default") return base;
  if (name == "all") return all;
  if (name == "context") return context;
  if (name == "context+ffs") return concat(context, {"ff_context.net.0.proj", "ff_context.net.2"});
  if (name == "all+ffs") return all_ffs;
  if (name == "all+ffs+embedder") return concat(all_ffs, {"x_embedder"});
  if (name == "ai-toolkit") return concat(all_ffs, {"norm.linear", "norm1.linear", "norm1_context.linear"});
  if (name == "tiny") return {"single_transformer_blocks.7.proj_out", "single_transformer_blocks.20.proj_out"};
  if (name == "nano") return {"single_transformer_blocks.7.proj_out"};
  throw_value_error("[lora] flux target preset must be one of " +
                    join(flux_lora_target_preset_names()) + ", got '" + name + "'");
}

std::vector<std::string> flux_lora_target_preset_names() {
  return {"default", "all", "context", "context+ffs", "all+ffs", "all+ffs+embedder",
          "ai-toolkit", "tiny", "nano"};
}

std::vector<std::string> mageflow_lora_target_modules(const std::string& name) {
  if (name != "default") {
    throw_value_error("[lora] mageflow target preset must be one of default, got '" + name + "'");
  }
  return {"to_k", "to_q", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"};
}

bool lora_target_matches(const std::string& name, const std::string& suffix) {
  if (name == suffix) return true;
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
         name[name.size() - suffix.size() - 1] == '.';
}

std::vector<std::string> apply_lora(torch::nn::Module& module,
                                    const std::vector<std::string>& target_suffixes, int64_t rank,
                                    double alpha) {
  if (rank < 1) throw_value_error("[lora] rank must be >= 1, got " + std::to_string(rank));
  if (!(alpha > 0.0)) throw_value_error("[lora] alpha must be > 0, got " + std::to_string(alpha));
  std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>> targets;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    auto linear = std::dynamic_pointer_cast<LinearImpl>(item.value());
    if (!linear) continue;
    for (const auto& suffix : target_suffixes) {
      if (lora_target_matches(item.key(), suffix)) {
        targets.emplace_back(item.key(), linear);
        break;
      }
    }
  }
  if (targets.empty()) {
    throw_value_error("[lora] target modules must match at least one Linear, got [" +
                                join(target_suffixes) + "]");
  }
  for (auto& p : module.parameters()) p.set_requires_grad(false);
  std::vector<std::string> names;
  for (auto& [name, linear] : targets) {
    linear->enable_lora(rank, alpha);
    names.push_back(name);
  }
  return names;
}

std::map<std::string, at::Tensor> lora_state_dict(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (is_lora_key(item.key())) out.emplace("transformer." + item.key(), item.value());
  }
  return out;
}

std::vector<at::Tensor> lora_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (is_lora_key(item.key())) out.push_back(item.value());
  }
  return out;
}

}  // namespace remat::models
