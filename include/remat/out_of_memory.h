#pragma once
/// \file
/// remat's rule for running out of memory (remat/util/error.h's convention applied to allocation):
/// an allocation that fails while remat does some named piece of work (encoding a picture,
/// decoding a sample, building an encoder) is reported as "[memory] <what> needs <N> bytes more
/// than it could get; this machine has <M> available: <what to change>", a c10::ValueError the CLI
/// turns into exit code 2, never as std::bad_alloc or the allocator's own text.
///
///   catch (const c10::Error& e) {
///     if (const auto bytes = memory::failed_allocation_bytes(e)) {
///       memory::throw_out_of_memory("encoding a 4096 x 4096 picture with the VAE", "lower resolution", *bytes);
///     }
///     ...
///
/// Predictions that refuse work before it starts (admission) are better where the demand can be
/// computed; this is the net under every stage where it cannot, or where a prediction can be wrong.

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include <c10/util/Exception.h>

#include "remat/export.h"

namespace remat::memory {

/// The bytes a failed allocation asked for: `e` is std::bad_alloc (size unknown: 0) or a
/// c10::Error from LibTorch's CPU or CUDA allocator ("tried to allocate N bytes" / "Tried to
/// allocate N GiB"). nullopt for any other exception.
REMAT_API std::optional<int64_t> failed_allocation_bytes(const std::exception& e);

/// The message described above for a failed allocation of `bytes` (0: unknown).
REMAT_API std::string out_of_memory_message(const std::string& what, const std::string& change, int64_t bytes);

/// Throws c10::ValueError with out_of_memory_message(what, change, bytes).
[[noreturn]] REMAT_API void throw_out_of_memory(const std::string& what, const std::string& change, int64_t bytes);

}  // namespace remat::memory
