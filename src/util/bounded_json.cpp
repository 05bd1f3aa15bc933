// The size and depth checks of Note [Bounded JSON] (remat/util/bounded_json.h).
#include "remat/util/bounded_json.h"

#include "remat/util/error.h"

#include "utf8.h"

namespace remat::util {

void check_json_text(std::string_view text, uint64_t max_bytes, const std::string& where) {
  if (text.size() > max_bytes) {
    throw_value_error(where + " is too large for a JSON document: " + std::to_string(text.size()) +
                      " bytes, at most " + std::to_string(max_bytes));
  }
  // A linear scan, independent of the parser: brackets count outside strings only; inside a
  // string a backslash escapes the next character. Malformed text is the parser's to report.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        throw_value_error(where + " nests arrays and objects deeper than " +
                          std::to_string(kMaxJsonDepth) + " levels (at byte " + std::to_string(i) +
                          ")");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

std::string text_excerpt(std::string_view text, size_t max_chars) {
  // Bytes that are not UTF-8 are written as \xHH: an excerpt is quoted through nlohmann::json,
  // whose dump() throws type_error 316 on them (a garbage tokenizer file must be named, not that).
  if (text.size() <= max_chars) return remat::detail::printable_utf8(text);
  return remat::detail::printable_utf8(text.substr(0, max_chars)) + "... (" + std::to_string(text.size()) + " bytes)";
}

std::string json_error_excerpt(const std::exception& e, size_t max_chars) {
  std::string_view text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    const size_t close = text.find("] ");
    if (close != std::string_view::npos) text.remove_prefix(close + 2);
  }
  return text_excerpt(text, max_chars);
}

}  // namespace remat::util
