#pragma once
// UTF-8 checks for text that ends up in JSON (cache indexes, metrics, the UI's answers) or in a
// message: nlohmann::json throws its own type_error 316 on invalid UTF-8 when it dumps, far from
// the file that held the bytes, so every boundary that takes a name or a text from outside (file
// names, caption files, tokenizer files, prompt files) checks it here first and names the file.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace remat::detail {

/// The length of the UTF-8 sequence that starts at s[i], or 0 when it is not valid UTF-8 there
/// (a bad lead byte, a cut or overlong sequence, a surrogate, past U+10FFFF).
inline size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || s.size() - i < n) return 0;
  uint32_t cp = n == 1 ? c : (c & (0x7Fu >> n));
  for (size_t k = 1; k < n; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kSmallest[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

/// The offset of the first byte that is not valid UTF-8, or nullopt when all of `s` is.
inline std::optional<size_t> invalid_utf8_at(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

/// `s` with every byte that is not valid UTF-8 written as \xHH: a name a message (or JSON) can
/// hold and a person can find with `ls -b`.
inline std::string printable_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02X", static_cast<unsigned char>(s[i]));
      out += hex;
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace remat::detail
