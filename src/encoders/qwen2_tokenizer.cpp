// The Qwen2 tokenizer (remat/encoders/qwen2_tokenizer.h): tokenizer.json read and checked against
// the pipeline transformers' Qwen2Tokenizer builds (models/qwen2/tokenization_qwen2.py), then the
// tokenizers library's steps (tokenizers/src/tokenizer/added_vocabulary.rs split_with_indices,
// normalizers NFC, pre_tokenizers split + byte_level, models/bpe word merges).
#include "remat/encoders/qwen2_tokenizer.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include "clip_text_normalize.h"
#include "json_file.h"
#include "remat/util/bounded_json.h"
#include "remat/util/error.h"

namespace remat::encoders {
namespace {

using Json = nlohmann::json;
using detail::code_points_to_utf8;
using detail::utf8_to_code_points;

bool is_letter(char32_t c) { return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_L_MASK) != 0; }
bool is_number(char32_t c) { return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_N_MASK) != 0; }
using detail::is_white_space;
bool is_line_end(char32_t c) { return c == U'\r' || c == U'\n'; }

// Length of the match of the pattern's alternatives at `i` (0: none), tried in order.
size_t match_at(const std::u32string& s, size_t i) {
  const size_t n = s.size();
  // (?i:'s|'t|'re|'ve|'m|'ll|'d): case-folded as the regex engine folds.
  if (s[i] == U'\'') {
    for (const std::u32string suffix : {U"s", U"t", U"re", U"ve", U"m", U"ll", U"d"}) {
      if (i + suffix.size() >= n) continue;
      bool same = true;
      for (size_t k = 0; k < suffix.size() && same; ++k) {
        same = static_cast<char32_t>(u_foldCase(static_cast<UChar32>(s[i + 1 + k]), U_FOLD_CASE_DEFAULT)) == suffix[k];
      }
      if (same) return suffix.size() + 1;
    }
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  const auto letters_from = [&](size_t j) {
    while (j < n && is_letter(s[j])) ++j;
    return j;
  };
  if (i + 1 < n && !is_line_end(s[i]) && !is_letter(s[i]) && !is_number(s[i]) && is_letter(s[i + 1])) {
    return letters_from(i + 1) - i;
  }
  if (is_letter(s[i])) return letters_from(i) - i;
  // \p{N}
  if (is_number(s[i])) return 1;
  // ' '?[^\s\p{L}\p{N}]+[\r\n]*
  {
    size_t j = s[i] == U' ' ? i + 1 : i;
    size_t k = j;
    while (k < n && !is_white_space(s[k]) && !is_letter(s[k]) && !is_number(s[k])) ++k;
    if (k > j) {
      while (k < n && is_line_end(s[k])) ++k;
      return k - i;
    }
  }
  if (!is_white_space(s[i])) return 0;
  size_t end = i;
  while (end < n && is_white_space(s[end])) ++end;
  // \s*[\r\n]+: the greedy \s* gives back up to the run's last line end.
  for (size_t p = end; p > i; --p) {
    if (is_line_end(s[p - 1])) return p - i;
  }
  // \s+(?!\S): the whole run at the end of the text, else all of it but its last character.
  if (end == n) return end - i;
  if (end - 1 > i) return end - 1 - i;
  // \s+
  return end - i;
}

// A piece of text: either an added token (its index in added_) or text still to tokenize.
struct Segment {
  std::u32string text;
  int added = -1;
};

// The tokenizers library's split_with_indices: the leftmost match of any of `tokens`, the longest
// there; lstrip / rstrip take the whitespace next to the match into it.
std::vector<Segment> split_added(const std::u32string& text, const std::vector<Qwen2AddedToken>& added,
                                 const std::vector<int>& candidates) {
  std::vector<std::u32string> contents;
  for (int t : candidates) contents.push_back(utf8_to_code_points(added[t].content, "an added token"));
  std::vector<Segment> out;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    int best = -1;
    size_t best_len = 0;
    for (size_t c = 0; c < candidates.size(); ++c) {
      const auto& token = contents[c];
      if (token.size() > best_len && text.compare(i, token.size(), token) == 0) best = static_cast<int>(c), best_len = token.size();
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const Qwen2AddedToken& token = added[candidates[best]];
    size_t a = i, b = i + best_len;
    if (token.lstrip) {
      while (a > start && is_white_space(text[a - 1])) --a;
    }
    if (token.rstrip) {
      while (b < text.size() && is_white_space(text[b])) ++b;
    }
    if (a > start) out.push_back({text.substr(start, a - start), -1});
    out.push_back({text.substr(a, b - a), candidates[best]});
    start = i = b;
  }
  if (start < text.size()) out.push_back({text.substr(start), -1});
  return out;
}

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw_value_error("[qwen2] tokenizer '" + path + "': " + what +
                    "; remat reads Qwen2's byte-level BPE tokenizer (Qwen2 / Qwen3 / Qwen3-VL)");
}

}  // namespace

const std::string& qwen2_split_pattern() {
  static const std::string pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  return pattern;
}

std::vector<std::string> qwen2_pre_tokenize(const std::string& text) {
  const std::u32string s = utf8_to_code_points(text, "text");
  std::vector<std::string> pieces;
  size_t gap = 0, i = 0;  // characters no alternative matches stay together (Split's "isolated")
  while (i < s.size()) {
    const size_t length = match_at(s, i);
    if (length == 0) {
      ++i;
      continue;
    }
    if (gap < i) pieces.push_back(code_points_to_utf8(s.substr(gap, i - gap)));
    pieces.push_back(code_points_to_utf8(s.substr(i, length)));
    i += length;
    gap = i;
  }
  if (gap < s.size()) pieces.push_back(code_points_to_utf8(s.substr(gap)));
  return pieces;
}

Qwen2Tokenizer Qwen2Tokenizer::from_directory(const std::string& dir) {
  return from_file((std::filesystem::path(dir) / "tokenizer.json").string());
}

Qwen2Tokenizer Qwen2Tokenizer::from_file(const std::string& path) {
  const Json j = remat::detail::read_json_file(path, "qwen2", "tokenizer.json");
  if (!j.is_object()) refuse(path, "the file is not a JSON object");
  const auto get = [&](const Json& parent, const char* key) -> const Json& {
    static const Json null;
    const auto it = parent.find(key);
    return it == parent.end() ? null : *it;
  };
  Qwen2Tokenizer t;
  t.path_ = path;
  // The model: BPE over byte symbols.
  const Json& model = get(j, "model");
  if (!model.is_object() || get(model, "type") != "BPE") {
    refuse(path, "model.type is " + util::json_excerpt(get(model, "type")) + ", not \"BPE\"");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "unk_token"}) {
    const Json& v = get(model, key);
    if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty())) {
      refuse(path, std::string("model.") + key + " is " + util::json_excerpt(v) + " (Qwen2 has none)");
    }
  }
  if (get(model, "byte_fallback") == true) refuse(path, "model.byte_fallback is true (Qwen2's is false)");
  t.ignore_merges_ = get(model, "ignore_merges") == true;
  const Json& vocab = get(model, "vocab");
  if (!vocab.is_object() || vocab.empty()) refuse(path, "model.vocab must be a non-empty object of token -> id");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      refuse(path, "model.vocab['" + util::text_excerpt(it.key()) + "'] must be an id >= 0, got " + util::json_excerpt(*it));
    }
    t.vocab_[it.key()] = it->get<int64_t>();
    t.id_to_token_[it->get<int64_t>()] = it.key();
  }
  const Json& merges = get(model, "merges");
  if (!merges.is_array()) refuse(path, "model.merges must be a list");
  for (const Json& m : merges) {
    std::string left, right;
    if (m.is_string()) {  // "left right"
      const std::string text = m.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        refuse(path, "merge " + util::json_excerpt(m) + " is not two symbols separated by a space");
      }
      left = text.substr(0, space), right = text.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["left", "right"]
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    } else {
      refuse(path, "merge " + util::json_excerpt(m) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    if (!t.vocab_.count(left + right)) refuse(path, "merge " + util::json_excerpt(m) + " makes a token not in the vocabulary");
    t.merge_ranks_.emplace(left + ' ' + right, static_cast<int64_t>(t.merge_ranks_.size()));
  }
  // Normalizer: NFC (Qwen2Tokenizer's), or none.
  const Json& normalizer = get(j, "normalizer");
  if (normalizer.is_null()) {
    t.nfc_ = false;
  } else if (get(normalizer, "type") != "NFC") {
    refuse(path, "normalizer is " + util::json_excerpt(normalizer) + ", not NFC");
  }
  // Pre-tokenizer: Split(Qwen2's pattern, isolated) then ByteLevel(no prefix space, no regex).
  const Json& pre = get(j, "pre_tokenizer");
  const Json& steps = get(pre, "pretokenizers");
  const bool shape = get(pre, "type") == "Sequence" && steps.is_array() && steps.size() == 2;
  const Json& split = shape ? steps[0] : Json();
  const Json& bytes = shape ? steps[1] : Json();
  if (!shape || get(split, "type") != "Split" || get(bytes, "type") != "ByteLevel") {
    refuse(path, "pre_tokenizer is " + util::json_excerpt(pre) + ", not Sequence[Split, ByteLevel]");
  }
  if (get(get(split, "pattern"), "Regex") != qwen2_split_pattern()) {
    refuse(path, "the Split pattern is " + util::json_excerpt(get(split, "pattern")) + ", not Qwen2's");
  }
  if (get(split, "behavior") != "Isolated" || get(split, "invert") == true) {
    refuse(path, "the Split is " + util::json_excerpt(split) + ", not behavior Isolated without invert");
  }
  if (get(bytes, "add_prefix_space") == true || get(bytes, "use_regex") == true) {
    refuse(path, "the ByteLevel step adds a prefix space or splits by GPT-2's regex (Qwen2's does neither)");
  }
  // Added tokens, split out before anything else.
  const Json& added = get(j, "added_tokens");
  if (!added.is_null() && !added.is_array()) refuse(path, "added_tokens must be a list");
  for (const Json& a : added.is_array() ? added : Json::array()) {
    if (!a.is_object() || !get(a, "id").is_number_integer() || !get(a, "content").is_string() ||
        get(a, "content").get<std::string>().empty()) {
      refuse(path, "added token " + util::json_excerpt(a) + " needs an integer id and non-empty content");
    }
    if (get(a, "single_word") == true) {
      refuse(path, "added token " + util::json_excerpt(get(a, "content")) + " is single_word, which remat does not implement");
    }
    Qwen2AddedToken token;
    token.id = get(a, "id").get<int64_t>();
    token.content = get(a, "content").get<std::string>();
    token.special = get(a, "special") == true;
    token.lstrip = get(a, "lstrip") == true;
    token.rstrip = get(a, "rstrip") == true;
    token.normalized = get(a, "normalized") == true;
    utf8_to_code_points(token.content, "[qwen2] added token");  // valid UTF-8
    t.id_to_token_[token.id] = token.content;
    t.added_.push_back(std::move(token));
  }
  return t;
}

std::optional<int64_t> Qwen2Tokenizer::token_id(const std::string& token) const {
  for (const auto& a : added_) {
    if (a.content == token) return a.id;
  }
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

int64_t Qwen2Tokenizer::vocab_size() const {
  int64_t top = -1;
  for (const auto& [id, token] : id_to_token_) top = std::max(top, id);
  return top + 1;
}

void Qwen2Tokenizer::append_word(const std::string& piece, std::vector<std::string>& tokens) const {
  std::vector<std::string> word = detail::word_to_symbols(utf8_to_code_points(piece, "text"));
  if (ignore_merges_) {
    std::string whole;
    for (const auto& s : word) whole += s;
    if (vocab_.count(whole)) {
      tokens.push_back(whole);
      return;
    }
  }
  // Merge the adjacent pair of lowest rank, all its non-overlapping occurrences left to right.
  while (word.size() > 1) {
    int64_t best = INT64_MAX;
    for (size_t k = 0; k + 1 < word.size(); ++k) {
      const auto it = merge_ranks_.find(word[k] + ' ' + word[k + 1]);
      if (it != merge_ranks_.end()) best = std::min(best, it->second);
    }
    if (best == INT64_MAX) break;
    std::vector<std::string> merged;
    for (size_t k = 0; k < word.size(); ++k) {
      if (k + 1 < word.size()) {
        const auto it = merge_ranks_.find(word[k] + ' ' + word[k + 1]);
        if (it != merge_ranks_.end() && it->second == best) {
          merged.push_back(word[k] + word[k + 1]);
          ++k;
          continue;
        }
      }
      merged.push_back(word[k]);
    }
    word = std::move(merged);
  }
  tokens.insert(tokens.end(), word.begin(), word.end());
}

void Qwen2Tokenizer::append_text(const std::string& text, std::vector<std::string>& tokens) const {
  for (const auto& piece : qwen2_pre_tokenize(text)) append_word(piece, tokens);
}

std::vector<std::string> Qwen2Tokenizer::tokenize(const std::string& text) const {
  if (text.size() > kMaxQwen2TextBytes) {
    throw_value_error("[qwen2] a text must be at most " + std::to_string(kMaxQwen2TextBytes) + " bytes, got " +
                      std::to_string(text.size()));
  }
  std::vector<int> raw, normalised;
  for (size_t a = 0; a < added_.size(); ++a) (added_[a].normalized ? normalised : raw).push_back(static_cast<int>(a));
  std::vector<std::string> tokens;
  for (const Segment& outer : split_added(utf8_to_code_points(text, "text"), added_, raw)) {
    if (outer.added >= 0) {
      tokens.push_back(added_[outer.added].content);
      continue;
    }
    const std::u32string normal = nfc_ ? detail::nfc(outer.text) : outer.text;
    for (const Segment& inner : split_added(normal, added_, normalised)) {
      if (inner.added >= 0) {
        tokens.push_back(added_[inner.added].content);
      } else {
        append_text(code_points_to_utf8(inner.text), tokens);
      }
    }
  }
  return tokens;
}

std::vector<int64_t> Qwen2Tokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const auto& token : tokenize(text)) {
    const auto id = token_id(token);
    if (!id) {
      throw_value_error("[qwen2] tokenizer '" + path_ + "' has no id for the token '" + util::text_excerpt(token) +
                        "' (its vocabulary lacks a byte symbol)");
    }
    ids.push_back(*id);
  }
  return ids;
}

std::string Qwen2Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::set<int64_t> added_ids;
  for (const auto& a : added_) added_ids.insert(a.id);
  std::string out, pending;  // byte symbols decode together: a character may span tokens
  const auto flush = [&] {
    out += detail::utf8_with_replacement(detail::symbols_to_bytes(pending));
    pending.clear();
  };
  for (const int64_t id : ids) {
    const auto it = id_to_token_.find(id);
    if (it == id_to_token_.end()) throw_value_error("[qwen2] no token has id " + std::to_string(id));
    if (added_ids.count(id)) {
      flush();
      out += it->second;
    } else {
      pending += it->second;
    }
  }
  flush();
  return out;
}

}  // namespace remat::encoders
