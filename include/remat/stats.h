#pragma once
/// \file
/// Small statistics shared by the profiler, the benchmark and run reporting.

#include <algorithm>
#include <vector>

namespace remat {

/// The median of `values` (the mean of the two middle values for an even count); 0 when empty.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace remat
