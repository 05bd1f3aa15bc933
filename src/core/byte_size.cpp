#include "string_helpers.h"
#include "remat/byte_size.h"

#include <cctype>
#include <cmath>
#include <limits>

#include <c10/util/Exception.h>

#include "remat/compat.h"

namespace remat {
namespace {

c10::ValueError value_error(const std::string& message) { return c10::ValueError(message, compat::no_backtrace()); }

}  // namespace

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  const auto fail = [&]() -> c10::ValueError {
    return value_error(what + " must be a byte size such as 20GiB, 512MiB, 1.5GB or "
                           "1048576 (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), got '" + text + "'");
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t number_begin = i;
  bool digits = false, dot = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) digits = true;
    else if (c == '.' && !dot) dot = true;
    else break;
  }
  if (!digits) throw fail();
  const long double number = std::strtold(text.substr(number_begin, i - number_begin).c_str(), nullptr);
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t unit_begin = i;
  while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const std::string unit = remat::detail::lower(text.substr(unit_begin, i - unit_begin));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) throw fail();

  long double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kib") scale = 1024.0L;
  else if (unit == "m" || unit == "mib") scale = 1024.0L * 1024;
  else if (unit == "g" || unit == "gib") scale = 1024.0L * 1024 * 1024;
  else if (unit == "t" || unit == "tib") scale = 1024.0L * 1024 * 1024 * 1024;
  else if (unit == "kb") scale = 1e3L;
  else if (unit == "mb") scale = 1e6L;
  else if (unit == "gb") scale = 1e9L;
  else if (unit == "tb") scale = 1e12L;
  else throw fail();
  if (scale == 1 && dot) {
    throw value_error(what + " must be a whole number of bytes when no unit is given, got '" +
                              text + "'");
  }
  const long double bytes = std::floor(number * scale);
  if (bytes > static_cast<long double>(std::numeric_limits<int64_t>::max())) {
    throw value_error(what + " must be at most 8EiB (2^63-1 bytes), got '" + text + "'");
  }
  return static_cast<int64_t>(bytes);
}

std::string format_byte_size(int64_t bytes) {
  static const std::pair<const char*, int64_t> kUnits[] = {
      {"TiB", int64_t{1} << 40}, {"GiB", int64_t{1} << 30}, {"MiB", int64_t{1} << 20}, {"KiB", int64_t{1} << 10}};
  for (const auto& [name, size] : kUnits) {
    if (bytes != 0 && bytes % size == 0) return std::to_string(bytes / size) + name;
  }
  return std::to_string(bytes);
}

}  // namespace remat
