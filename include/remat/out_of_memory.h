#pragma once
/// \file
/// remat's rule for running out of memory (remat/error.h's convention applied to allocation):
/// an allocation that fails while remat does some named piece of work (encoding a picture,
/// decoding a sample, building an encoder) is reported as "[memory] <what> needs <N> bytes more
/// than it could get; this machine has <M> available: <what to change>", a c10::ValueError the CLI
/// turns into exit code 2, never as std::bad_alloc or the allocator's own text.
///
///   auto latents = memory::name_allocation_failures("encoding 4096 x 4096 pictures with the VAE",
///       "lower resolution or set --vae_enable_tiling", [&] { return vae->encode(picture); });
///
/// Predictions that refuse work before it starts (admission) are better where the demand can be
/// computed; this is the net under every stage where it cannot, or where a prediction can be wrong.

#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include <c10/util/Exception.h>

#include "remat/export.h"

namespace remat::memory {

/// The bytes a failed allocation asked for: `e` is std::bad_alloc (size unknown: 0) or a
/// c10::Error from LibTorch's CPU or CUDA allocator ("tried to allocate N bytes" / "Tried to
/// allocate N GiB"). nullopt for any other exception.
REMAT_API std::optional<int64_t> failed_allocation_bytes(const std::exception& e);

/// Throws the c10::ValueError described above for a failed allocation of `bytes` (0: unknown).
[[noreturn]] REMAT_API void throw_out_of_memory(const std::string& what, const std::string& change, int64_t bytes);

/// Runs `work`; an allocation failure inside it becomes throw_out_of_memory(what, change, N).
/// Every other exception passes through unchanged.
template <typename Work>
decltype(auto) name_allocation_failures(const std::string& what, const std::string& change, Work&& work) {
  try {
    return std::forward<Work>(work)();
  } catch (const c10::ValueError&) {
    throw;  // already remat's error (an inner stage named it)
  } catch (const std::exception& e) {
    if (const auto bytes = failed_allocation_bytes(e)) throw_out_of_memory(what, change, *bytes);
    throw;
  }
}

}  // namespace remat::memory
