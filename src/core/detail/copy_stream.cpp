#include "detail/copy_stream.h"

#include <map>
#include <mutex>
#include <utility>

#include <c10/core/impl/VirtualGuardImpl.h>

namespace remat::detail {

c10::Stream copy_stream(const at::Device& device) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, c10::Stream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(static_cast<int>(device.type()), static_cast<int>(device.index()));
  auto it = streams.find(key);
  if (it == streams.end()) {
    c10::impl::VirtualGuardImpl impl(device.type());
    it = streams.emplace(key, impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false)).first;
  }
  return it->second;
}

at::Device resolved_device(const at::Device& device) {
  if (device.has_index() || device.is_cpu()) return device;
  c10::impl::VirtualGuardImpl impl(device.type());
  return impl.getDevice();
}

}  // namespace remat::detail
