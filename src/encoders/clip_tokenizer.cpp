// ClipTokenizer: reading vocab.json / merges.txt / the special-token files, BPE, encode and decode,
// as transformers' slow CLIPTokenizer (models/clip/tokenization_clip.py) and PreTrainedTokenizer
// do them, and diffusers' FluxPipeline._get_clip_prompt_embeds asks for them.

#include "remat/encoders/clip_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "clip_text_normalize.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"

namespace remat::encoders {
namespace {

// transformers reads merges.txt lines [1, 49152 - 256 - 2] only: the merges of CLIP's 49152-entry
// BPE vocabulary, less the byte symbols and the two special tokens.
constexpr size_t kMaxMerges = 49152 - 256 - 2;
constexpr uint64_t kMaxMergesFileBytes = uint64_t{64} << 20;

std::string file_tag(const std::string& path) { return "[clip] tokenizer file '" + path + "': "; }

nlohmann::json parse_json_file(const std::string& path) {
  const std::string text = util::read_regular_file(path, util::kMaxJsonFileBytes, "clip", "tokenizer file");
  util::check_json_text(text, util::kMaxJsonFileBytes, "[clip] tokenizer file '" + path + "'");
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object()) throw_value_error(file_tag(path) + "must hold a JSON object");
    return j;
  } catch (const nlohmann::json::parse_error& e) {
    throw_value_error(file_tag(path) + "malformed JSON: " + util::json_error_excerpt(e));
  }
}

// A special token in tokenizer_config.json / special_tokens_map.json: a string, or an AddedToken
// object with "content".
void read_special(const nlohmann::json& j, const char* key, std::string& out, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (it->is_string()) {
    out = it->get<std::string>();
    return;
  }
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    out = (*it)["content"].get<std::string>();
    return;
  }
  throw_value_error(file_tag(path) + "'" + key + "' must be a string or an object with a string \"content\", got " +
                    util::json_excerpt(*it));
}

void read_specials(const std::string& path, ClipTokenizer::SpecialTokens& specials) {
  const nlohmann::json j = parse_json_file(path);
  read_special(j, "bos_token", specials.bos, path);
  read_special(j, "eos_token", specials.eos, path);
  read_special(j, "pad_token", specials.pad, path);
  read_special(j, "unk_token", specials.unk, path);
}

// Python-list text of one string as diffusers' log line shows batch_decode's result.
std::string python_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    if (c == '\\' || c == quote) out += '\\';
    out += c;
  }
  return out + quote;
}

}  // namespace

std::string ClipEncoding::truncation_message() const {
  if (removed_text.empty()) return "";
  return "The following part of your input was truncated because CLIP can only handle sequences up to " +
         std::to_string(max_length) + " tokens: [" + python_repr(removed_text) + "]";
}

ClipTokenizer ClipTokenizer::build(const std::string& vocab_json, const std::string& merges_txt,
                                   const SpecialTokens& specials) {
  ClipTokenizer tok;
  tok.specials_ = specials;

  const nlohmann::json vocab = parse_json_file(vocab_json);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto& v = it.value();
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0) ||
        (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))) {
      throw_value_error(file_tag(vocab_json) + "the id of token " + nlohmann::json(util::text_excerpt(it.key())).dump() +
                        " must be an integer in [0, 2^31), got " + util::json_excerpt(v));
    }
    const int64_t id = v.get<int64_t>();
    tok.vocab_[it.key()] = id;
    tok.id_to_token_[id] = it.key();
  }
  if (tok.vocab_.empty()) throw_value_error(file_tag(vocab_json) + "the vocabulary is empty");

  const std::string text = util::read_regular_file(merges_txt, kMaxMergesFileBytes, "clip", "tokenizer file");
  // read().strip().split("\n"): surrounding whitespace of the whole file goes first.
  const size_t first = text.find_first_not_of(" \t\r\n\f\v");
  const size_t last = text.find_last_not_of(" \t\r\n\f\v");
  const std::string body = first == std::string::npos ? "" : text.substr(first, last - first + 1);
  size_t pos = 0, line_no = 0;
  while (pos <= body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    const std::string line = body.substr(pos, end - pos);
    ++line_no;
    pos = end + 1;
    if (line_no == 1) {
      if (line.rfind("#version", 0) != 0) {
        throw_value_error("[clip] tokenizer file '" + merges_txt + "' line 1: expected the \"#version: 0.2\" header, got " +
                          nlohmann::json(util::text_excerpt(line)).dump());
      }
      continue;
    }
    if (line_no - 1 > kMaxMerges) break;
    // merge.split(): any run of whitespace separates the two symbols.
    std::vector<std::string> parts;
    size_t k = 0;
    while (k < line.size()) {
      while (k < line.size() && std::isspace(static_cast<unsigned char>(line[k]))) ++k;
      const size_t s = k;
      while (k < line.size() && !std::isspace(static_cast<unsigned char>(line[k]))) ++k;
      if (k > s) parts.push_back(line.substr(s, k - s));
    }
    if (parts.size() != 2) {
      throw_value_error("[clip] tokenizer file '" + merges_txt + "' line " + std::to_string(line_no) +
                        ": expected two symbols separated by a space, got " +
                        nlohmann::json(util::text_excerpt(line)).dump());
    }
    detail::utf8_to_code_points(line, "tokenizer file '" + merges_txt + "' line " + std::to_string(line_no));
    // dict(zip(merges, range(...))): a repeated merge keeps its last rank.
    tok.merge_ranks_[parts[0] + " " + parts[1]] = static_cast<int64_t>(line_no - 2);
  }
  if (line_no == 0 || body.empty()) {
    throw_value_error("[clip] tokenizer file '" + merges_txt + "' line 1: expected the \"#version: 0.2\" header, got an empty file");
  }

  auto special_id = [&](const std::string& token, const char* role) {
    auto it = tok.vocab_.find(token);
    if (it == tok.vocab_.end()) {
      throw_value_error(file_tag(vocab_json) + "the " + role + " token " + nlohmann::json(token).dump() +
                        " is not in the vocabulary");
    }
    return it->second;
  };
  tok.bos_id_ = special_id(specials.bos, "bos");
  tok.eos_id_ = special_id(specials.eos, "eos");
  tok.pad_id_ = special_id(specials.pad, "pad");
  tok.unk_id_ = special_id(specials.unk, "unk");
  return tok;
}

ClipTokenizer ClipTokenizer::from_files(const std::string& vocab_json, const std::string& merges_txt) {
  return build(vocab_json, merges_txt, SpecialTokens{});
}

ClipTokenizer ClipTokenizer::from_directory(const std::string& dir) {
  namespace fs = std::filesystem;
  SpecialTokens specials;
  // special_tokens_map.json is applied after tokenizer_config.json, as from_pretrained does.
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path path = fs::path(dir) / name;
    std::error_code ec;
    if (fs::exists(path, ec)) read_specials(path.string(), specials);
  }
  return build((fs::path(dir) / "vocab.json").string(), (fs::path(dir) / "merges.txt").string(), specials);
}

std::string ClipTokenizer::bpe(const std::string& token) const {
  // CLIPTokenizer.bpe: the last symbol carries "</w>"; repeatedly merge every occurrence of the
  // lowest-ranked adjacent pair, left to right, until no pair has a rank.
  if (token == "<|startoftext|>" || token == "<|endoftext|>") return token;  // its cache entries
  std::vector<std::string> word = detail::word_to_symbols(detail::utf8_to_code_points(token, "token"));
  if (word.empty()) return "";
  word.back() += "</w>";
  while (word.size() > 1) {
    int64_t best_rank = std::numeric_limits<int64_t>::max();
    std::string best_first, best_second;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = merge_ranks_.find(word[i] + " " + word[i + 1]);
      if (it != merge_ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best_first = word[i];
        best_second = word[i + 1];
      }
    }
    if (best_rank == std::numeric_limits<int64_t>::max()) break;
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == best_first && word[i + 1] == best_second) {
        merged.push_back(best_first + best_second);
        i += 2;
      } else {
        merged.push_back(word[i]);
        i += 1;
      }
    }
    word.swap(merged);
  }
  std::string out;
  for (const auto& s : word) out += (out.empty() ? "" : " ") + s;
  return out;
}

int64_t ClipTokenizer::id_of(const std::string& symbol) const {
  auto it = vocab_.find(symbol);
  return it == vocab_.end() ? unk_id_ : it->second;
}

std::vector<std::string> ClipTokenizer::tokenize(const std::string& caption) const {
  if (caption.size() > kMaxClipCaptionBytes) {
    throw_value_error("[clip] a caption must be at most " + std::to_string(kMaxClipCaptionBytes) +
                      " bytes of UTF-8, got " + std::to_string(caption.size()));
  }
  detail::utf8_to_code_points(caption, "caption");
  // PreTrainedTokenizer.tokenize splits on the special tokens first (exact, case-sensitive) and
  // tokenizes the text between them.
  std::vector<std::string> specials = {specials_.bos, specials_.eos, specials_.pad, specials_.unk};
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= caption.size()) {
    size_t hit = std::string::npos, hit_len = 0;
    for (const auto& s : specials) {
      const size_t p = caption.find(s, pos);
      if (p != std::string::npos && (p < hit || (p == hit && s.size() > hit_len))) hit = p, hit_len = s.size();
    }
    const std::string chunk = caption.substr(pos, hit == std::string::npos ? std::string::npos : hit - pos);
    const std::u32string clean = detail::clean_caption(detail::utf8_to_code_points(chunk, "caption"));
    for (const auto& word : detail::split_words(clean)) {
      const std::string symbols = bpe(detail::code_points_to_utf8(word));
      size_t s = 0;
      while (s < symbols.size()) {
        size_t e = symbols.find(' ', s);
        if (e == std::string::npos) e = symbols.size();
        out.push_back(symbols.substr(s, e - s));
        s = e + 1;
      }
    }
    if (hit == std::string::npos) break;
    out.push_back(caption.substr(hit, hit_len));
    pos = hit + hit_len;
  }
  return out;
}

std::vector<int64_t> ClipTokenizer::content_ids(const std::string& caption) const {
  std::vector<int64_t> ids;
  for (const auto& symbol : tokenize(caption)) ids.push_back(id_of(symbol));
  return ids;
}

ClipEncoding ClipTokenizer::encode(const std::string& caption, int64_t max_length) const {
  if (max_length < 2 || max_length > 4096) {
    throw_value_error("[clip] max_length must be in [2, 4096], got " + std::to_string(max_length));
  }
  const std::vector<int64_t> content = content_ids(caption);
  const size_t keep = std::min(content.size(), static_cast<size_t>(max_length - 2));
  ClipEncoding enc;
  enc.max_length = max_length;
  enc.ids.push_back(bos_id_);
  enc.ids.insert(enc.ids.end(), content.begin(), content.begin() + static_cast<std::ptrdiff_t>(keep));
  enc.ids.push_back(eos_id_);
  enc.attention_mask.assign(enc.ids.size(), 1);
  enc.ids.resize(static_cast<size_t>(max_length), pad_id_);
  enc.attention_mask.resize(static_cast<size_t>(max_length), 0);
  // diffusers decodes untruncated_ids[:, max_length - 1 : -1]: the content past the kept part.
  if (keep < content.size()) {
    enc.removed_text = decode(std::vector<int64_t>(content.begin() + static_cast<std::ptrdiff_t>(keep), content.end()));
  }
  return enc;
}

std::string ClipTokenizer::decode(const std::vector<int64_t>& ids) const {
  // PreTrainedTokenizer._decode: runs of ordinary tokens are turned back into text
  // (convert_tokens_to_string), special tokens are written as they are, the parts joined by spaces.
  const std::vector<std::string> specials = {specials_.bos, specials_.eos, specials_.pad, specials_.unk};
  std::vector<std::string> parts;
  std::string run;
  auto flush = [&] {
    if (run.empty()) return;
    std::string text = detail::utf8_with_replacement(detail::symbols_to_bytes(run));
    for (size_t p = text.find("</w>"); p != std::string::npos; p = text.find("</w>", p + 1)) text.replace(p, 4, " ");
    const size_t a = text.find_first_not_of(' '), b = text.find_last_not_of(' ');
    parts.push_back(a == std::string::npos ? "" : text.substr(a, b - a + 1));
    run.clear();
  };
  for (int64_t id : ids) {
    auto it = id_to_token_.find(id);
    if (it == id_to_token_.end()) continue;  // the slow tokenizer's decoder.get() gives None: dropped
    if (std::find(specials.begin(), specials.end(), it->second) != specials.end()) {
      flush();
      parts.push_back(it->second);
    } else {
      run += it->second;
    }
  }
  flush();
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? " " : "") + parts[i];
  return out;
}

}  // namespace remat::encoders
