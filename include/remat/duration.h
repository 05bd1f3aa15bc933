#pragma once
/// \file
/// Durations as progress lines and summaries print them (training steps, the caching phase).

#include <string>

#include "remat/export.h"

namespace remat {

/// Formats seconds as "850ms", "12.3s", "1m05s" or "1h2m05s".
REMAT_API std::string format_duration(double seconds);

}  // namespace remat
