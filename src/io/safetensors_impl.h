#pragma once
// Helpers shared by the safetensors reader, writer and module loader. Private to remat::io.

#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

namespace remat::io::detail {

/// The LibTorch type for a format dtype name, or nullopt if remat does not support it.
std::optional<at::ScalarType> find_dtype(const std::string& name);

/// The format name of a LibTorch type, or nullopt if the format cannot hold it.
std::optional<std::string> find_dtype_name(at::ScalarType type);

/// Position of a supported dtype in the reference writer's dtype order (BOOL = 0 ... I64 = 9).
int dtype_rank(at::ScalarType type);

/// "BOOL, U8, ..., I64", for error messages.
std::string supported_dtype_list();

/// "[2, 3]".
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace remat::io::detail
