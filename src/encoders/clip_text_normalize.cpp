// Text handling of the CLIP tokenizer, following transformers' models/clip/tokenization_clip.py
// (BasicTokenizer._clean_text, _tokenize_chinese_chars, whitespace_tokenize, the `pat` regex,
// bytes_to_unicode) on the no-ftfy path. Character classes come from ICU.

#include "clip_text_normalize.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "remat/util/error.h"

namespace remat::encoders::detail {
namespace {

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// Length and minimum code point of a UTF-8 sequence starting with `lead`; 0 when it cannot lead.
int sequence_length(unsigned char lead, char32_t& minimum) {
  if (lead < 0x80) return minimum = 0, 1;
  if (lead >= 0xC2 && lead <= 0xDF) return minimum = 0x80, 2;
  if (lead >= 0xE0 && lead <= 0xEF) return minimum = 0x800, 3;
  if (lead >= 0xF0 && lead <= 0xF4) return minimum = 0x10000, 4;
  return 0;
}

// Decodes the sequence at text[i]; returns its length, or the length of the maximal invalid
// subpart as a negative number.
int decode_one(const std::string& text, size_t i, char32_t& cp) {
  const auto lead = static_cast<unsigned char>(text[i]);
  char32_t minimum = 0;
  const int n = sequence_length(lead, minimum);
  if (n == 0) return -1;
  cp = n == 1 ? lead : (lead & (0xFF >> (n + 1)));
  for (int k = 1; k < n; ++k) {
    if (i + k >= text.size() || !is_continuation(static_cast<unsigned char>(text[i + k]))) return -k;
    cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    // Overlong, surrogate and too-large forms are rejected at the second byte, as the Unicode
    // "maximal subpart" practice (and CPython's decoder) does.
    if (k == 1) {
      const auto b = static_cast<unsigned char>(text[i + 1]);
      if ((lead == 0xE0 && b < 0xA0) || (lead == 0xED && b > 0x9F) || (lead == 0xF0 && b < 0x90) ||
          (lead == 0xF4 && b > 0x8F)) {
        return -1;
      }
    }
  }
  return cp < minimum ? -1 : n;
}

bool is_category(char32_t c, uint32_t mask) { return (U_GET_GC_MASK(static_cast<UChar32>(c)) & mask) != 0; }
bool is_letter(char32_t c) { return is_category(c, U_GC_L_MASK); }
bool is_number(char32_t c) { return is_category(c, U_GC_N_MASK); }

// transformers' _is_control: category C*, except \t \n \r (which are whitespace there).
bool is_control(char32_t c) {
  if (c == U'\t' || c == U'\n' || c == U'\r') return false;
  return is_category(c, U_GC_C_MASK);
}

// transformers' _is_whitespace.
bool is_bert_whitespace(char32_t c) {
  return c == U' ' || c == U'\t' || c == U'\n' || c == U'\r' || is_category(c, U_GC_ZS_MASK);
}

// Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
bool is_python_space(char32_t c) {
  const auto dir = u_charDirection(static_cast<UChar32>(c));
  return dir == U_WHITE_SPACE_NEUTRAL || dir == U_BLOCK_SEPARATOR || dir == U_SEGMENT_SEPARATOR ||
         is_category(c, U_GC_ZS_MASK);
}

// BasicTokenizer._is_chinese_char: the CJK Unified Ideographs blocks (not Hangul, kana).
bool is_cjk_ideograph(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) ||
         (cp >= 0x2B820 && cp <= 0x2CEAF) || (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

icu::UnicodeString to_icu(const std::u32string& s) {
  return icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(s.data()), static_cast<int32_t>(s.size()));
}

std::u32string from_icu(const icu::UnicodeString& s) {
  std::u32string out;
  for (int32_t i = 0; i < s.length();) {
    const UChar32 c = s.char32At(i);
    out.push_back(static_cast<char32_t>(c));
    i += U16_LENGTH(c);
  }
  return out;
}


bool starts_with(const std::u32string& text, size_t i, const std::u32string& prefix) {
  return text.compare(i, prefix.size(), prefix) == 0;
}

}  // namespace

std::u32string utf8_to_code_points(const std::string& text, const std::string& what) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const int n = decode_one(text, i, cp);
    if (n < 0) {
      throw_value_error("[clip] " + what + " is not valid UTF-8 (at byte " + std::to_string(i) + ")");
    }
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

std::string code_points_to_utf8(const std::u32string& text) {
  std::string out;
  for (char32_t c : text) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

std::string utf8_with_replacement(const std::string& bytes) {
  std::u32string out;
  for (size_t i = 0; i < bytes.size();) {
    char32_t cp = 0;
    const int n = decode_one(bytes, i, cp);
    out.push_back(n > 0 ? cp : U'\uFFFD');
    i += static_cast<size_t>(n > 0 ? n : -n);
  }
  return code_points_to_utf8(out);
}

std::u32string nfc(const std::u32string& text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
  TORCH_CHECK(U_SUCCESS(status), "[tokenizer] ICU has no NFC normaliser: ", u_errorName(status));
  const icu::UnicodeString normalized = normalizer->normalize(to_icu(text), status);
  TORCH_CHECK(U_SUCCESS(status), "[tokenizer] NFC normalisation failed: ", u_errorName(status));
  return from_icu(normalized);
}

bool is_white_space(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)) != 0; }

std::u32string clean_caption(const std::u32string& text) {
  // _clean_text, then _tokenize_chinese_chars.
  std::u32string cleaned;
  cleaned.reserve(text.size());
  for (char32_t c : text) {
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    if (is_bert_whitespace(c)) {
      cleaned.push_back(U' ');
    } else if (is_cjk_ideograph(c)) {
      cleaned += U' ';
      cleaned.push_back(c);
      cleaned += U' ';
    } else {
      cleaned.push_back(c);
    }
  }
  // NFC ("prevents treating the same character with different code points as different").
  const std::u32string nfc_text = nfc(cleaned);

  // whitespace_tokenize (str.split()), lower() per word, " ".join.
  std::u32string out;
  size_t i = 0;
  while (i < nfc_text.size()) {
    while (i < nfc_text.size() && is_python_space(nfc_text[i])) ++i;
    const size_t start = i;
    while (i < nfc_text.size() && !is_python_space(nfc_text[i])) ++i;
    if (i == start) break;
    icu::UnicodeString word = to_icu(nfc_text.substr(start, i - start));
    // The root locale's full mapping is Python's str.lower() (SpecialCasing, final sigma).
    word.toLower(icu::Locale::getRoot());
    if (!out.empty()) out += U' ';
    out += from_icu(word);
  }
  return out;
}

std::vector<std::u32string> split_words(const std::u32string& text) {
  static const std::u32string kStart = U"<|startoftext|>", kEnd = U"<|endoftext|>";
  static const std::u32string kContractions[] = {U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"};
  std::vector<std::u32string> words;
  size_t i = 0;
  while (i < text.size()) {
    // Alternatives are tried in the pattern's order at each position; the first that matches wins.
    if (starts_with(text, i, kStart) || starts_with(text, i, kEnd)) {
      const size_t n = starts_with(text, i, kStart) ? kStart.size() : kEnd.size();
      words.push_back(text.substr(i, n));
      i += n;
      continue;
    }
    bool matched = false;
    for (const auto& c : kContractions) {
      if (starts_with(text, i, c)) {
        words.push_back(c);
        i += c.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    const char32_t c = text[i];
    size_t j = i + 1;
    if (is_letter(c)) {
      while (j < text.size() && is_letter(text[j])) ++j;
    } else if (is_number(c)) {
      // one character: "12" is two words
    } else if (!is_white_space(c)) {
      while (j < text.size() && !is_letter(text[j]) && !is_number(text[j]) && !is_white_space(text[j])) ++j;
    } else {
      ++i;  // whitespace matches no alternative
      continue;
    }
    words.push_back(text.substr(i, j - i));
    i = j;
  }
  return words;
}

const std::array<char32_t, 256>& byte_symbols() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

std::vector<std::string> word_to_symbols(const std::u32string& word) {
  const auto& table = byte_symbols();
  std::vector<std::string> symbols;
  for (unsigned char b : code_points_to_utf8(word)) symbols.push_back(code_points_to_utf8(std::u32string(1, table[b])));
  return symbols;
}

std::string symbols_to_bytes(const std::string& symbols) {
  static const auto inverse = [] {
    std::array<int, 0x200> inv{};
    inv.fill(-1);
    const auto& table = byte_symbols();
    for (int b = 0; b < 256; ++b) inv[table[b]] = b;
    return inv;
  }();
  std::string out;
  for (char32_t c : utf8_to_code_points(symbols, "token text")) {
    if (c < inverse.size() && inverse[c] >= 0) out += static_cast<char>(inverse[c]);
  }
  return out;
}

}  // namespace remat::encoders::detail
