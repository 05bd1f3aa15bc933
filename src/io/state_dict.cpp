// Loading safetensors files into a torch::nn::Module, and saving a module's state.
#include <algorithm>
#include <sstream>
#include <unordered_map>

#include <torch/torch.h>

#include "safetensors_impl.h"
#include "remat/io/safetensors.h"

namespace remat::io {

std::vector<NamedTensor> module_state(const torch::nn::Module& module) {
  std::vector<NamedTensor> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  }
  return out;
}

void save_module(const std::string& path, const torch::nn::Module& module,
                 const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, module_state(module), metadata);
}

std::string LoadReport::describe() const {
  if (ok()) return {};
  std::ostringstream out;
  out << missing.size() << " missing, " << unexpected.size() << " unexpected, "
      << mismatched.size() << " shape-mismatched key(s)";
  for (const auto& key : missing) out << "\n  missing key (in the module, not in the file): " << key;
  for (const auto& key : unexpected) {
    out << "\n  unexpected key (in the file, not in the module): " << key;
  }
  for (const auto& m : mismatched) {
    out << "\n  shape mismatch for " << m.key << ": file " << detail::shape_string(m.file_shape)
        << ", module " << detail::shape_string(m.module_shape);
  }
  return out.str();
}

namespace {

// One file tensor matched to one module tensor.
struct Copy {
  at::Tensor destination;
  const SafetensorsFile* file;
  std::string file_key;
};

std::string file_list(const std::vector<SafetensorsFile>& files) {
  std::string out;
  for (const auto& f : files) out += (out.empty() ? "'" : ", '") + f.path() + "'";
  return out;
}

}  // namespace

LoadReport load_state_dict_into(torch::nn::Module& module,
                                const std::vector<SafetensorsFile>& files,
                                const LoadOptions& options) {
  std::unordered_map<std::string, at::Tensor> targets;
  for (auto& [name, tensor] : module_state(module)) targets.emplace(name, tensor);

  LoadReport report;
  std::vector<Copy> copies;
  std::unordered_map<std::string, std::string> provided_by;  // module key -> file path
  for (const auto& file : files) {
    for (const auto& file_key : file.names()) {
      if (options.key_filter && !options.key_filter(file_key)) {
        report.skipped.push_back(file_key);
        continue;
      }
      std::string key = file_key;
      if (!options.strip_prefix.empty()) {
        if (key.compare(0, options.strip_prefix.size(), options.strip_prefix) != 0) {
          report.unexpected.push_back(file_key);
          continue;
        }
        key.erase(0, options.strip_prefix.size());
      }
      key = options.add_prefix + key;
      auto [it, inserted] = provided_by.emplace(key, file.path());
      TORCH_CHECK(inserted, "[load_state_dict] key '", key, "' is provided by both '", it->second,
                  "' and '", file.path(), "' (file key '", file_key, "')");
      auto target = targets.find(key);
      if (target == targets.end()) {
        report.unexpected.push_back(file_key);
        continue;
      }
      const auto& info = file.info(file_key);
      const auto module_shape = target->second.sizes().vec();
      if (info.shape != module_shape) {
        report.mismatched.push_back({key, info.shape, module_shape});
        continue;
      }
      copies.push_back({target->second, &file, file_key});
      report.loaded.push_back(key);
    }
  }
  for (const auto& [key, tensor] : targets) {
    if (provided_by.count(key) == 0) report.missing.push_back(key);
  }
  std::sort(report.loaded.begin(), report.loaded.end());
  std::sort(report.missing.begin(), report.missing.end());
  std::sort(report.unexpected.begin(), report.unexpected.end());
  std::sort(report.skipped.begin(), report.skipped.end());
  std::sort(report.mismatched.begin(), report.mismatched.end(),
            [](const ShapeMismatch& a, const ShapeMismatch& b) { return a.key < b.key; });

  // Strict mode checks everything before copying anything, so a failed load leaves the module
  // exactly as it was.
  TORCH_CHECK(!options.strict || report.ok(), "[load_state_dict] cannot load ", file_list(files),
              " into the module (strict): ", report.describe());

  torch::NoGradGuard no_grad;
  for (const auto& copy : copies) {
    // copy_ converts dtype and device in one pass, reading straight from the mapping.
    copy.destination.copy_(copy.file->view(copy.file_key));
    require_finite(copy.destination, "load_state_dict", copy.file->path(), copy.file_key);
  }
  return report;
}

LoadReport load_state_dict_into(torch::nn::Module& module, const SafetensorsFile& file,
                                const LoadOptions& options) {
  return load_state_dict_into(module, std::vector<SafetensorsFile>{file}, options);
}

LoadReport load_state_dict_into(torch::nn::Module& module, const std::string& path,
                                const LoadOptions& options) {
  return load_state_dict_into(module, SafetensorsFile::open(path), options);
}

}  // namespace remat::io
