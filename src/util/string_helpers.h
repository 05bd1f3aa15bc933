#pragma once
// Private string helpers shared by every layer: the small functions each file used to write for itself.

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include <c10/util/ArrayRef.h>
#include <c10/util/StringUtil.h>

namespace remat::detail {

inline bool starts_with(std::string_view s, std::string_view head) { return s.substr(0, head.size()) == head; }

inline bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

inline bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

/// ASCII lower case (option values, file extensions: never user text in other scripts).
inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

/// `s` without leading and trailing white space (std::isspace).
inline std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

inline std::string join(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

/// "[2, 3]", as PyTorch prints a shape.
inline std::string shape_text(c10::IntArrayRef shape) { return c10::str(shape); }

/// A number as a person writes it (0.9, 1e-06, 3.5): the stream's default format.
inline std::string render_number(double v) { return c10::str(v); }

/// `s` safe inside HTML or XML text and quoted attribute values: & < > " ' as entities.
inline std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace remat::detail
