// The safetensors writer: validate everything, write a temporary file beside the destination,
// fsync, rename(2). A reader never sees a half-written checkpoint and a failed save never
// damages the previous one.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "safetensors_impl.h"
#include "remat/io/safetensors.h"

namespace remat::io {

namespace {

using Json = nlohmann::ordered_json;

// Owns the temporary file until commit(): on any exit before it, closes and unlinks it.
class TempFile {
 public:
  explicit TempFile(const std::string& destination) : destination_(destination) {
    namespace fs = std::filesystem;
    const fs::path dest(destination);
    const fs::path dir = dest.has_parent_path() ? dest.parent_path() : fs::path(".");
    // A dot name in the same directory keeps rename(2) atomic (same file system).
    std::string templ = (dir / ("." + dest.filename().string() + ".tmp.XXXXXX")).string();
    fd_ = ::mkstemp(templ.data());
    TORCH_CHECK(fd_ >= 0, "[safetensors] cannot write '", destination,
                "': cannot create a temporary file in '", dir.string(), "': ", std::strerror(errno));
    path_ = templ;
  }

  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }

  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write_all(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (size > 0) {
      // Linux caps one write at ~2 GiB; loop for large tensors and partial writes.
      const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      TORCH_CHECK(n > 0, "[safetensors] cannot write '", destination_, "' (temporary file '",
                  path_, "'): ", std::strerror(errno));
      p += n;
      size -= static_cast<size_t>(n);
    }
  }

  void commit() {
    // mkstemp creates mode 0600; a checkpoint should be readable like any other file.
    ::fchmod(fd_, 0644);
    TORCH_CHECK(::fsync(fd_) == 0, "[safetensors] cannot flush '", path_, "': ",
                std::strerror(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    TORCH_CHECK(rc == 0, "[safetensors] cannot close '", path_, "': ", std::strerror(errno));
    TORCH_CHECK(::rename(path_.c_str(), destination_.c_str()) == 0, "[safetensors] cannot rename '",
                path_, "' to '", destination_, "': ", std::strerror(errno));
    committed_ = true;
  }

 private:
  std::string destination_;
  std::string path_;
  int fd_ = -1;
  bool committed_ = false;
};

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

  TempFile out(path);
  out.write_all(length, sizeof(length));
  out.write_all(text.data(), text.size());
  for (const auto& item : plan) {
    if (item.nbytes == 0) continue;
    // One tensor at a time, so a GPU model is staged through at most one CPU copy.
    const auto cpu = item.entry->second.detach().to(at::kCPU).contiguous();
    TORCH_INTERNAL_ASSERT(static_cast<uint64_t>(cpu.nbytes()) == item.nbytes);
    out.write_all(cpu.data_ptr(), item.nbytes);
  }
  out.commit();
}

}  // namespace remat::io
