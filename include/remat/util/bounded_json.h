#pragma once
/// \file
/// The one policy for JSON that remat reads (config files, safetensors headers, training-state
/// files, model config.json): its size and nesting depth are checked before it is parsed, and
/// error messages quote a bounded excerpt of a value, never the whole value.
///
/// Note [Bounded JSON]
/// Every JSON document remat reads comes from a file someone else may have written. nlohmann's
/// parser is iterative, but dump() recurses over a value, so an error message that quoted a
/// 100k-deep array overflowed the stack; and a huge document costs memory before any check can
/// look at it. So: check_json_text() bounds the size and the depth of the text (no remat file
/// nests deeper than 3 levels; kMaxJsonDepth leaves room for other writers' metadata), and
/// messages quote values through json_excerpt(), which stops after kExcerptChars characters and
/// kExcerptDepth levels whatever the value.
///
/// nlohmann_json stays a private dependency: json_excerpt is a template over the JSON type,
/// instantiated in the .cpp files that parse.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "remat/export.h"

namespace remat::util {

/// Deepest nesting of arrays and objects accepted in any JSON remat reads.
inline constexpr int kMaxJsonDepth = 64;
/// Largest config-like JSON file (config.json, state.json, a model's config.json): 16 MiB.
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t{16} << 20;
/// Largest safetensors header: 100 MB, the reference implementation's limit (MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
/// Characters of a value or a text that an error message quotes.
inline constexpr size_t kExcerptChars = 120;
/// Nesting levels of a value that an error message shows before writing "...".
inline constexpr int kExcerptDepth = 4;

/// Throws c10::ValueError when `text` is longer than `max_bytes` or nests arrays and objects
/// deeper than kMaxJsonDepth (brackets inside strings do not count), naming `where` (e.g.
/// "[train] config 'my.json'"), the limit and the byte offset. Does not check the syntax: the
/// parser does that afterwards, on text whose depth is then bounded.
REMAT_API void check_json_text(std::string_view text, uint64_t max_bytes, const std::string& where);

/// The first `max_chars` characters of `text`, followed by "... (N bytes)" when it is longer.
REMAT_API std::string text_excerpt(std::string_view text, size_t max_chars = kExcerptChars);

/// The message of a JSON parser's exception without nlohmann's "[json.exception.parse_error.101] "
/// prefix (the reader's own text names the file; the library's error code means nothing to a
/// user), excerpted: "parse error at line 1, column 2: syntax error while parsing value ...".
REMAT_API std::string json_error_excerpt(const std::exception& e, size_t max_chars = 2 * kExcerptChars);

namespace detail {

template <typename Json>
void append_excerpt(const Json& value, std::string& out, size_t max_chars, int depth) {
  if (out.size() > max_chars) return;
  if (depth >= kExcerptDepth && (value.is_array() || value.is_object()) && !value.empty()) {
    out += value.is_array() ? "[...]" : "{...}";
    return;
  }
  if (value.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = value.begin(); it != value.end() && out.size() <= max_chars; ++it) {
      if (!first) out += ',';
      first = false;
      out += Json(text_excerpt(it.key(), max_chars)).dump();
      out += ':';
      append_excerpt(it.value(), out, max_chars, depth + 1);
    }
    out += '}';
  } else if (value.is_array()) {
    out += '[';
    bool first = true;
    for (auto it = value.begin(); it != value.end() && out.size() <= max_chars; ++it) {
      if (!first) out += ',';
      first = false;
      append_excerpt(*it, out, max_chars, depth + 1);
    }
    out += ']';
  } else if (value.is_string()) {
    // Only the head of a long string is copied and escaped.
    const auto& s = value.template get_ref<const typename Json::string_t&>();
    out += Json(s.size() > max_chars ? s.substr(0, max_chars) : s).dump();
  } else {
    out += value.dump();  // a number, boolean or null: short
  }
}

}  // namespace detail

/// A JSON value as compact text for an error message: at most kExcerptChars characters (then
/// "..."), nested values past kExcerptDepth levels shown as [...] / {...}. Never recurses deeper
/// than kExcerptDepth, whatever the value.
template <typename Json>
std::string json_excerpt(const Json& value, size_t max_chars = kExcerptChars) {
  std::string out;
  detail::append_excerpt(value, out, max_chars, 0);
  if (out.size() > max_chars) out = out.substr(0, max_chars) + "...";
  return out;
}

}  // namespace remat::util
