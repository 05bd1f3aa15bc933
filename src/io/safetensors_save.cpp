// The safetensors writer: validate everything, then write through util::AtomicFile (a temporary
// file beside the destination, fsync, rename(2)). A reader never sees a half-written checkpoint
// and a failed save never damages the previous one.
#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "safetensors_impl.h"
#include "remat/io/safetensors.h"
#include "remat/util/files.h"

namespace remat::io {

namespace {

using Json = nlohmann::ordered_json;

struct Planned {
  const NamedTensor* entry;
  at::ScalarType dtype;
  uint64_t nbytes;
};

}  // namespace

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& entries,
                      const std::map<std::string, std::string>& metadata) {
  // Check every entry before creating any file.
  std::vector<Planned> plan;
  std::set<std::string> seen;
  for (const auto& entry : entries) {
    const auto& [name, tensor] = entry;
    TORCH_CHECK_VALUE(!name.empty(), "[safetensors] cannot write '", path,
                      "': tensor names must be non-empty");
    TORCH_CHECK_VALUE(name != "__metadata__", "[safetensors] cannot write '", path,
                      "': a tensor must not be named __metadata__ (reserved for the metadata map)");
    TORCH_CHECK_VALUE(seen.insert(name).second, "[safetensors] cannot write '", path,
                      "': tensor name '", name, "' appears twice");
    TORCH_CHECK_VALUE(tensor.defined(), "[safetensors] cannot write '", path, "': tensor '", name,
                      "' is undefined");
    const auto dtype = tensor.scalar_type();
    TORCH_CHECK_VALUE(detail::find_dtype_name(dtype).has_value(), "[safetensors] cannot write '",
                      path, "': tensor '", name, "' has dtype ", dtype,
                      "; supported dtypes: ", detail::supported_dtype_list());
    plan.push_back({&entry, dtype, static_cast<uint64_t>(tensor.numel()) * tensor.element_size()});
  }
  // The reference writer's order: widest dtype first, then name. Each tensor then starts at a
  // multiple of its element size (sizes are powers of two and the data buffer is 8-aligned).
  std::sort(plan.begin(), plan.end(), [](const Planned& a, const Planned& b) {
    const int ra = detail::dtype_rank(a.dtype), rb = detail::dtype_rank(b.dtype);
    return ra != rb ? ra > rb : a.entry->first < b.entry->first;
  });

  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& item : plan) {
    Json info = Json::object();
    info["dtype"] = *detail::find_dtype_name(item.dtype);
    info["shape"] = item.entry->second.sizes().vec();
    info["data_offsets"] = {offset, offset + item.nbytes};
    header[item.entry->first] = std::move(info);
    offset += item.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  uint8_t length[8];
  uint64_t n = text.size();
  for (auto& byte : length) {
    byte = static_cast<uint8_t>(n & 0xff);
    n >>= 8;
  }

  util::AtomicFile out(path, "safetensors");
  out.write(length, sizeof(length));
  out.write(text.data(), text.size());
  for (const auto& item : plan) {
    if (item.nbytes == 0) continue;
    // One tensor at a time, so a GPU model is staged through at most one CPU copy.
    const auto cpu = item.entry->second.detach().to(at::kCPU).contiguous();
    TORCH_INTERNAL_ASSERT(static_cast<uint64_t>(cpu.nbytes()) == item.nbytes);
    out.write(cpu.data_ptr(), item.nbytes);
  }
  out.commit();
}

}  // namespace remat::io
