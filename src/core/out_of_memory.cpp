// Allocation failures named (remat/out_of_memory.h).
#include "remat/out_of_memory.h"

#include <cstdlib>
#include <new>
#include <regex>

#include "remat/util/error.h"
#include "remat/memory.h"

namespace remat::memory {
namespace {

// LibTorch's allocator messages (c10/core/impl/alloc_cpu.cpp, c10/cuda/CUDACachingAllocator.cpp):
//   "DefaultCPUAllocator: can't allocate memory: you tried to allocate 54000000064 bytes."
//   "DefaultCPUAllocator: not enough memory: you tried to allocate 54000000064 bytes."
//   "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of ..."
std::optional<int64_t> bytes_in_allocator_message(const std::string& text) {
  static const std::regex cpu(R"(allocate (\d+) bytes)");
  static const std::regex cuda(R"(Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB))");
  std::smatch m;
  if (std::regex_search(text, m, cpu)) return std::strtoll(m[1].str().c_str(), nullptr, 10);
  if (std::regex_search(text, m, cuda)) {
    double value = std::strtod(m[1].str().c_str(), nullptr);
    for (const char* unit : {"KiB", "MiB", "GiB", "TiB"}) {
      if (m[2].str() == "B") break;
      value *= 1024;
      if (m[2].str() == unit) break;
    }
    return static_cast<int64_t>(value);
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> failed_allocation_bytes(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return 0;
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    const std::string text = error->what_without_backtrace();
    if (text.find("DefaultCPUAllocator") != std::string::npos || text.find("out of memory") != std::string::npos) {
      return bytes_in_allocator_message(text).value_or(0);
    }
  }
  return std::nullopt;
}

std::string out_of_memory_message(const std::string& what, const std::string& change, int64_t bytes) {
  const int64_t available = available_bytes(c10::Device(c10::kCPU)) - current_bytes(c10::Device(c10::kCPU));
  std::string message = "[memory] " + what + " ran out of memory: ";
  message += bytes > 0 ? "one allocation of " + format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes) failed"
                       : "an allocation failed";
  message += "; this machine has " + format_bytes(available) + " available";
  if (!change.empty()) message += ": " + change;
  return message;
}

void throw_out_of_memory(const std::string& what, const std::string& change, int64_t bytes) {
  throw_value_error(out_of_memory_message(what, change, bytes));
}

}  // namespace remat::memory
