#pragma once
/// \file
/// remat's one error convention. Bad input (a value, an option, a file, a combination the caller
/// can change) throws c10::ValueError, the exception of LibTorch's TORCH_CHECK_VALUE, with a
/// message that starts with the component in brackets ("[flux]", "[train]"), names the offending
/// value and says what is valid; the CLI prints it and exits with code 2. Other failed checks
/// throw c10::Error (TORCH_CHECK). remat::train::ValidationError is a c10::ValueError that also
/// carries the option and value at fault.

#include <string>

#include "remat/export.h"

namespace remat {

/// Throws c10::ValueError with `message` (no backtrace: the message is the whole report).
[[noreturn]] REMAT_API void throw_value_error(const std::string& message);

}  // namespace remat
