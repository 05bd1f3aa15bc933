#pragma once
// Private text handling of the byte-level BPE tokenizers (CLIP's, and Qwen2's in qwen2_tokenizer.cpp):
// UTF-8 <-> code points, NFC and Unicode White_Space (ICU), the clean-up transformers' CLIPTokenizer
// runs when ftfy is absent, CLIP's pre-tokenizer regex, and the byte <-> symbol table.

#include <array>
#include <string>
#include <vector>

namespace remat::encoders::detail {

/// Code points of valid UTF-8 `text`; throws c10::ValueError naming `what` and the byte offset
/// of the first invalid sequence (overlong forms, surrogates and values past U+10FFFF included).
std::u32string utf8_to_code_points(const std::string& text, const std::string& what);
std::string code_points_to_utf8(const std::u32string& text);
/// Bytes decoded as Python's bytes.decode("utf-8", errors="replace") does: each maximal invalid
/// subpart becomes U+FFFD.
std::string utf8_with_replacement(const std::string& bytes);

/// Unicode normalisation form C (ICU's Normalizer2).
std::u32string nfc(const std::u32string& text);
/// Unicode's White_Space property: `\s` of the regex engines the tokenizers' patterns run on.
bool is_white_space(char32_t c);

/// transformers' BasicTokenizer(strip_accents=False, do_split_on_punc=False).tokenize(text),
/// joined with single spaces: NUL, U+FFFD and control characters (category C* but \t \n \r)
/// dropped; whitespace (space, \t \n \r, Zs) made a space; spaces put around CJK ideographs; NFC;
/// split on whitespace as Python's str.split() does; each word lower-cased (full Unicode mapping).
std::u32string clean_caption(const std::u32string& text);

/// re.findall of CLIPTokenizer's pattern over `text` (already clean and lower-cased):
/// <|startoftext|>|<|endoftext|>|'s|'t|'re|'ve|'m|'ll|'d|\p{L}+|\p{N}|[^\s\p{L}\p{N}]+
std::vector<std::u32string> split_words(const std::u32string& text);

/// GPT-2's byte -> printable symbol table: bytes 33-126, 161-172 and 174-255 map to themselves;
/// the other 68, in increasing order, to U+0100 + k.
const std::array<char32_t, 256>& byte_symbols();
/// The UTF-8 bytes of `word`, each replaced by its symbol (one string per symbol).
std::vector<std::string> word_to_symbols(const std::u32string& word);
/// Inverse of the table over a symbol string; characters outside the table are dropped (the
/// slow tokenizer would raise there; only special-token text can contain them).
std::string symbols_to_bytes(const std::string& symbols);

}  // namespace remat::encoders::detail
