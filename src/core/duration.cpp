#include "remat/duration.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>

namespace remat {

std::string format_duration(double seconds) {
  char short_form[32];
  if (seconds < 1.0) {
    std::snprintf(short_form, sizeof(short_form), "%.0fms", seconds * 1e3);
    return short_form;
  }
  if (seconds < 60.0) {
    std::snprintf(short_form, sizeof(short_form), "%.1fs", seconds);
    return short_form;
  }
  const int64_t whole = static_cast<int64_t>(std::lround(seconds));
  std::ostringstream out;
  if (whole >= 3600) out << whole / 3600 << "h";
  out << (whole % 3600) / 60 << "m";
  const int64_t s = whole % 60;
  out << (s < 10 ? "0" : "") << s << "s";
  return out.str();
}

}  // namespace remat
