#pragma once
/// \file
/// Byte sizes as people write them ("20GiB", "512MiB", "1.5GB"): the one parser behind every
/// option and flag that takes a size (memory budgets, `remat bench --layouts auto:SIZE`).

#include <cstdint>
#include <string>

#include "remat/export.h"

namespace remat {

/// Parses a byte size: a non-negative number with an optional unit, case-insensitive, spaces
/// allowed before the unit. Binary units B, KiB, MiB, GiB, TiB (powers of 1024), decimal units
/// KB, MB, GB, TB (powers of 1000); K/M/G/T alone are binary. Fractions are allowed with a unit
/// and rounded down to whole bytes. Throws c10::ValueError ("[<what>] must be a byte size such
/// as ..., got '<text>'") for anything else, or a value above 2^63-1 bytes.
REMAT_API int64_t parse_byte_size(const std::string& text, const std::string& what = "byte size");

/// Formats a byte count the way parse_byte_size reads it back exactly: "20GiB", "512MiB", or
/// plain bytes when no binary unit divides it.
REMAT_API std::string format_byte_size(int64_t bytes);

}  // namespace remat
