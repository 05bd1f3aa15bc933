// ClipTokenizer on write_tiny_clip_tokenizer's vocabulary: token pieces checked by hand against
// the algorithm of transformers' slow CLIPTokenizer without ftfy (clean-up, split regex, byte
// symbols, BPE), ids looked up in vocab.json read here, byte-symbol ids computed from the
// bytes_to_unicode order; plus malformed files.

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "remat/encoders/clip_text_model.h"
#include "remat/encoders/clip_tokenizer.h"
#include "temp_dir.h"
#include "value_error.h"

namespace {
namespace clip_tokenizer_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::encoders::ClipTokenizer;
using remat::testing::error_of;
using Pieces = std::vector<std::string>;

// The id of byte `b`'s symbol in CLIP's vocab order: bytes 33-126, 161-172, 174-255 first, then
// the other 68 in increasing order; "</w>" forms follow at +256.
int64_t byte_id(int b, bool word_end = false) {
  int64_t index;
  if (b >= 33 && b <= 126) index = b - 33;
  else if (b >= 161 && b <= 172) index = 94 + (b - 161);
  else if (b >= 174) index = 106 + (b - 174);
  else if (b <= 32) index = 188 + b;
  else if (b <= 160) index = 188 + 33 + (b - 127);
  else index = 188 + 33 + 34;  // 173
  return index + (word_end ? 256 : 0);
}

class ClipTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    temp_ = std::make_unique<remat::testing::TempDir>("remat_clip_tok");
    dir_ = temp_->str();
    remat::encoders::write_tiny_clip_tokenizer(dir_);
    std::ifstream in(fs::path(dir_) / "vocab.json");
    vocab_ = nlohmann::json::parse(in);
  }
  static void TearDownTestSuite() { temp_.reset(); }

  static std::vector<int64_t> ids_of(const Pieces& pieces) {
    std::vector<int64_t> ids;
    for (const auto& p : pieces) {
      EXPECT_TRUE(vocab_.contains(p)) << p;
      ids.push_back(vocab_.value(p, -1));
    }
    return ids;
  }
  // bos, the pieces' ids, eos, then pad (731) up to 77.
  static std::vector<int64_t> framed(const Pieces& pieces) {
    std::vector<int64_t> ids = {730};
    for (auto id : ids_of(pieces)) ids.push_back(id);
    ids.push_back(731);
    ids.resize(77, 731);
    return ids;
  }
  // Writes `text` to `name` in the scratch directory of the malformed-file tests.
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(bad_ / name, std::ios::binary) << text;
  }

  ClipTokenizer tok() const { return ClipTokenizer::from_directory(dir_); }

  remat::testing::TempDir bad_{"remat_clip_bad"};
  static std::unique_ptr<remat::testing::TempDir> temp_;
  static std::string dir_;
  static nlohmann::json vocab_;
};
std::unique_ptr<remat::testing::TempDir> ClipTokenizerTest::temp_;
std::string ClipTokenizerTest::dir_;
nlohmann::json ClipTokenizerTest::vocab_;

TEST_F(ClipTokenizerTest, TinyFilesMatchTheTinyModel) {
  const auto t = tok();
  EXPECT_EQ(t.vocab_size(), remat::encoders::ClipTextConfig::tiny().vocab_size);
  EXPECT_EQ(t.merge_count(), 218);
  EXPECT_EQ(t.bos_id(), 730);
  EXPECT_EQ(t.eos_id(), 731);
  EXPECT_EQ(t.pad_id(), 731);
  EXPECT_EQ(t.bos_id(), remat::encoders::ClipTextConfig::tiny().bos_token_id);
  EXPECT_EQ(t.eos_id(), remat::encoders::ClipTextConfig::tiny().eos_token_id);
  EXPECT_EQ(vocab_["!"], 0);
  EXPECT_EQ(vocab_["a"], byte_id('a'));
  EXPECT_EQ(vocab_["a</w>"], 320);  // as in CLIP's own vocabulary
  EXPECT_EQ(vocab_["\xC4\xA0"], byte_id(' '));  // space is U+0120
  std::ifstream merges(fs::path(dir_) / "merges.txt");
  std::string header;
  std::getline(merges, header);
  EXPECT_EQ(header, "#version: 0.2");
  for (const char* f : {"tokenizer_config.json", "special_tokens_map.json"}) EXPECT_TRUE(fs::exists(fs::path(dir_) / f));
}

TEST_F(ClipTokenizerTest, FramesWithBosEosAndPadsTo77) {
  const Pieces pieces = {"a</w>", "red</w>", "square</w>", "on</w>", "a</w>", "blue</w>", "background</w>"};
  EXPECT_EQ(tok().tokenize("a red square on a blue background"), pieces);
  const auto enc = tok().encode("a red square on a blue background");
  EXPECT_EQ(enc.ids, framed(pieces));
  std::vector<int64_t> mask(77, 0);
  std::fill(mask.begin(), mask.begin() + 9, 1);
  EXPECT_EQ(enc.attention_mask, mask);
  EXPECT_EQ(enc.removed_text, "");
  EXPECT_EQ(enc.truncation_message(), "");
  // An empty caption is bos, eos, padding.
  EXPECT_EQ(tok().encode("").ids, framed({}));
}

TEST_F(ClipTokenizerTest, LowerCasesAndSplitsPunctuation) {
  const Pieces pieces = {"a</w>", "yellow</w>", "triangle</w>", ",</w>", "on</w>",
                         "a</w>", "black</w>", "background</w>", "!</w>"};
  EXPECT_EQ(tok().tokenize("A Yellow TRIANGLE, on a BLACK background!"), pieces);
  EXPECT_EQ(ids_of({",</w>", "!</w>"}), (std::vector<int64_t>{byte_id(',', true), byte_id('!', true)}));
  // A run of symbols is one regex word, BPE'd from bytes.
  EXPECT_EQ(tok().tokenize("?!"), (Pieces{"?", "!</w>"}));
}

TEST_F(ClipTokenizerTest, WhitespaceRunsAndOneDigitPerToken) {
  EXPECT_EQ(tok().tokenize("   3 green circles,   12 dots.  "),
            (Pieces{"3</w>", "green</w>", "circles</w>", ",</w>", "1</w>", "2</w>", "dots</w>", ".</w>"}));
  EXPECT_EQ(tok().tokenize("tab\tand\n\nnew  line"), tok().tokenize("tab and new line"));
  EXPECT_EQ(tok().content_ids("2024"), (std::vector<int64_t>{byte_id('2', true), byte_id('0', true),
                                                             byte_id('2', true), byte_id('4', true)}));
}

TEST_F(ClipTokenizerTest, AccentsAreKeptAsUtf8ByteSymbols) {
  // é = C3 A9, ï = C3 AF, – = E2 80 93 (one symbol run), 🙂 = F0 9F 99 82; no merge covers them.
  const auto ids = tok().content_ids("café naïve – 🙂");
  const std::vector<int64_t> want = {
      byte_id('c'), byte_id('a'), byte_id('f'), byte_id(0xC3), byte_id(0xA9, true),
      byte_id('n'), byte_id('a'), byte_id(0xC3), byte_id(0xAF), byte_id('v'), byte_id('e', true),
      byte_id(0xE2), byte_id(0x80), byte_id(0x93, true),
      byte_id(0xF0), byte_id(0x9F), byte_id(0x99), byte_id(0x82, true)};
  EXPECT_EQ(ids, want);
  EXPECT_EQ(tok().tokenize("CAFÉ"), tok().tokenize("café"));  // lower() of É is é
  // A decomposed é (e + U+0301) is composed first (NFC).
  EXPECT_EQ(tok().tokenize("cafe\xCC\x81"), tok().tokenize("caf\xC3\xA9"));
}

TEST_F(ClipTokenizerTest, CjkIdeographsAreSeparateWords) {
  // 北 = E5 8C 97, 京 = E4 BA AC: spaces go around each ideograph, so each ends a word.
  EXPECT_EQ(tok().content_ids("北京"),
            (std::vector<int64_t>{byte_id(0xE5), byte_id(0x8C), byte_id(0x97, true), byte_id(0xE4), byte_id(0xBA),
                                  byte_id(0xAC, true)}));
  // Hangul is not spaced out: 서울 stays one word (letters).
  const auto hangul = tok().tokenize("서울");
  EXPECT_EQ(hangul.back().substr(hangul.back().size() - 4), "</w>");
  EXPECT_EQ(std::count_if(hangul.begin(), hangul.end(),
                          [](const std::string& s) { return s.find("</w>") != std::string::npos; }), 1);
}

TEST_F(ClipTokenizerTest, ApostropheContractions) {
  EXPECT_EQ(tok().tokenize("it's a white cross; isn't it?"),
            (Pieces{"it</w>", "'", "s</w>", "a</w>", "white</w>", "cross</w>", ";</w>", "i", "s", "n</w>", "'", "t</w>",
                    "it</w>", "?</w>"}));
  EXPECT_EQ(tok().tokenize("THE CAT'S"), (Pieces{"the</w>", "cat</w>", "'", "s</w>"}));
  // 're 've 'll 'd 'm are regex words too; a lone apostrophe before a non-contraction is a symbol run.
  EXPECT_EQ(tok().tokenize("we'll"), (Pieces{"w", "e</w>", "'", "l", "l</w>"}));
  EXPECT_EQ(tok().tokenize("o'x").size(), 3u);  // o</w>, '</w>, x</w>
}

TEST_F(ClipTokenizerTest, ControlCharactersAndOddSpacesAreCleanedUp) {
  // \x01 and DEL are dropped (no space), U+200B (Cf) is dropped, NBSP and U+3000 are spaces.
  EXPECT_EQ(tok().tokenize("re\x01" "d\x7f"), tok().tokenize("red"));
  EXPECT_EQ(tok().tokenize("re\xE2\x80\x8B" "d"), tok().tokenize("red"));
  EXPECT_EQ(tok().tokenize("red\xC2\xA0" "square\xE3\x80\x80" "on"), tok().tokenize("red square on"));
}

TEST_F(ClipTokenizerTest, LiteralSpecialTokensStaySpecial) {
  EXPECT_EQ(tok().content_ids("a <|endoftext|> red"), (std::vector<int64_t>{320, 731, vocab_["red</w>"]}));
  EXPECT_EQ(tok().content_ids("<|startoftext|>"), (std::vector<int64_t>{730}));
}

TEST_F(ClipTokenizerTest, TruncatesTo75ContentTokensAndReportsTheRest) {
  std::string caption;
  for (int i = 0; i < 80; ++i) caption += "a ";
  caption += "red square";
  const auto enc = tok().encode(caption);
  ASSERT_EQ(enc.ids.size(), 77u);
  EXPECT_EQ(enc.ids[0], 730);
  for (int i = 1; i <= 75; ++i) EXPECT_EQ(enc.ids[i], 320) << i;
  EXPECT_EQ(enc.ids[76], 731);
  EXPECT_EQ(enc.attention_mask, std::vector<int64_t>(77, 1));
  EXPECT_EQ(enc.removed_text, "a a a a a red square");
  EXPECT_EQ(enc.truncation_message(),
            "The following part of your input was truncated because CLIP can only handle sequences up to 77 tokens: "
            "['a a a a a red square']");
  // Exactly 75 content tokens: nothing removed, eos at 76.
  std::string fits;
  for (int i = 0; i < 75; ++i) fits += "a ";
  const auto full = tok().encode(fits);
  EXPECT_EQ(full.ids[76], 731);
  EXPECT_EQ(full.removed_text, "");
  // A shorter max_length.
  const auto short_enc = tok().encode("a red square on", 4);
  EXPECT_EQ(short_enc.ids, (std::vector<int64_t>{730, 320, vocab_["red</w>"], 731}));
  EXPECT_EQ(short_enc.removed_text, "square on");
  EXPECT_NE(short_enc.truncation_message().find("up to 4 tokens: ['square on']"), std::string::npos);
}

TEST_F(ClipTokenizerTest, DecodeUndoesBytesAndWordEnds) {
  EXPECT_EQ(tok().decode(tok().content_ids("a Café, 12 🙂!")), "a café , 1 2 🙂!");
  EXPECT_EQ(tok().decode({320, 731, 320}), "a <|endoftext|> a");
}

TEST_F(ClipTokenizerTest, FromFilesUsesTheDefaultSpecials) {
  const auto t = ClipTokenizer::from_files((fs::path(dir_) / "vocab.json").string(), (fs::path(dir_) / "merges.txt").string());
  EXPECT_EQ(t.encode("a red square").ids, tok().encode("a red square").ids);
}

TEST_F(ClipTokenizerTest, RejectsBadCaptions) {
  EXPECT_NE(error_of([&] { tok().encode("ab\xFF" "cd"); }).find("[clip] caption is not valid UTF-8 (at byte 2)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tok().encode("\xED\xA0\x80"); }).find("not valid UTF-8"), std::string::npos);  // surrogate
  EXPECT_NE(error_of([&] { tok().encode(std::string(remat::encoders::kMaxClipCaptionBytes + 1, 'a')); })
                .find("at most 16384 bytes"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tok().encode("a", 1); }).find("max_length must be in [2, 4096], got 1"), std::string::npos);
}

TEST_F(ClipTokenizerTest, MalformedFilesNameTheFileAndLine) {
  const std::string d = bad_.str();
  const std::string vocab = (fs::path(d) / "vocab.json").string(), merges = (fs::path(d) / "merges.txt").string();
  fs::copy_file(fs::path(dir_) / "vocab.json", vocab, fs::copy_options::overwrite_existing);

  write("merges.txt", "r e\nt h\n");
  EXPECT_EQ(error_of([&] { ClipTokenizer::from_files(vocab, merges); }),
            "[clip] tokenizer file '" + merges + "' line 1: expected the \"#version: 0.2\" header, got \"r e\"\n");
  write("merges.txt", "#version: 0.2\nr e\nt h x\n");
  EXPECT_EQ(error_of([&] { ClipTokenizer::from_files(vocab, merges); }),
            "[clip] tokenizer file '" + merges + "' line 3: expected two symbols separated by a space, got \"t h x\"\n");
  write("merges.txt", "");
  EXPECT_NE(error_of([&] { ClipTokenizer::from_files(vocab, merges); }).find("line 1"), std::string::npos);
  write("merges.txt", "#version: 0.2\nr e\n");

  write("vocab.json", "{\"a\": 1,");
  EXPECT_NE(error_of([&] { ClipTokenizer::from_files(vocab, merges); }).find("[clip] tokenizer file '" + vocab + "': malformed JSON"),
            std::string::npos);
  write("vocab.json", "{\"a\": -3, \"<|startoftext|>\": 1, \"<|endoftext|>\": 2}");
  EXPECT_EQ(error_of([&] { ClipTokenizer::from_files(vocab, merges); }),
            "[clip] tokenizer file '" + vocab + "': the id of token \"a\" must be an integer in [0, 2^31), got -3\n");
  write("vocab.json", "{\"a\": 0, \"<|startoftext|>\": 1}");
  EXPECT_EQ(error_of([&] { ClipTokenizer::from_files(vocab, merges); }),
            "[clip] tokenizer file '" + vocab + "': the eos token \"<|endoftext|>\" is not in the vocabulary\n");
  write("vocab.json", "[1, 2]");
  EXPECT_NE(error_of([&] { ClipTokenizer::from_files(vocab, merges); }).find("must hold a JSON object"), std::string::npos);
  EXPECT_NE(error_of([&] { ClipTokenizer::from_files(vocab + ".missing", merges); }).find(vocab + ".missing"),
            std::string::npos);

  // A special token of the wrong type in tokenizer_config.json.
  fs::copy_file(fs::path(dir_) / "vocab.json", vocab, fs::copy_options::overwrite_existing);
  write("tokenizer_config.json", "{\"pad_token\": 5}");
  EXPECT_EQ(error_of([&] { ClipTokenizer::from_directory(d); }),
            "[clip] tokenizer file '" + (fs::path(d) / "tokenizer_config.json").string() +
                "': 'pad_token' must be a string or an object with a string \"content\", got 5\n");
  // AddedToken objects are accepted.
  write("tokenizer_config.json", "{\"pad_token\": {\"__type\": \"AddedToken\", \"content\": \"!\"}}");
  EXPECT_EQ(ClipTokenizer::from_directory(d).pad_id(), 0);
}

}  // namespace clip_tokenizer_test
}  // namespace
