// The Qwen2 tokenizer: the pre-tokenizer's pieces worked out by hand from the regex's alternatives
// (leftmost alternative first, greedy quantifiers with backtracking), the BPE invariants on the demo
// tokenizer.json (lossless, every token in the vocabulary, no mergeable pair left in a piece), special
// tokens split out, no BOS / EOS, and the errors. The ids were compared once with the tokenizers
// library's own Tokenizer on the same file (docs/MAGEFLOW_PARITY.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

#include "remat/encoders/qwen2_tokenizer.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::encoders {
namespace {
namespace qwen2_tokenizer_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;
using Pieces = std::vector<std::string>;

TEST(Qwen2PreTokenizer, PiecesOfEachAlternative) {
  // Letters with one leading non-letter; contractions; one digit per piece; punctuation with the
  // line ends after it.
  EXPECT_EQ(qwen2_pre_tokenize("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(qwen2_pre_tokenize("It's 2024!\n\nOK"), (Pieces{"It", "'s", " ", "2", "0", "2", "4", "!\n\n", "OK"}));
  EXPECT_EQ(qwen2_pre_tokenize("WE'LL GO"), (Pieces{"WE", "'LL", " GO"}));  // (?i:...)
  EXPECT_EQ(qwen2_pre_tokenize("(red)"), (Pieces{"(red", ")"}));
  EXPECT_EQ(qwen2_pre_tokenize("a ... b"), (Pieces{"a", " ...", " b"}));
  // Whitespace: a run before a word keeps its last character for the word (\s+(?!\S)); a run with
  // line ends ends at its last line end (\s*[\r\n]+); a run at the end stays whole.
  EXPECT_EQ(qwen2_pre_tokenize("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(qwen2_pre_tokenize("x \n y"), (Pieces{"x", " \n", " y"}));
  EXPECT_EQ(qwen2_pre_tokenize("end   "), (Pieces{"end", "   "}));
  EXPECT_EQ(qwen2_pre_tokenize("\t\tx"), (Pieces{"\t", "\tx"}));
  // Unicode: CJK ideographs and Hangul are letters, emoji are neither letters nor numbers, accents
  // are letters; the fullwidth digit is a number.
  EXPECT_EQ(qwen2_pre_tokenize("一只猫 빨간"), (Pieces{"一只猫", " 빨간"}));
  EXPECT_EQ(qwen2_pre_tokenize("café😀😀!"), (Pieces{"café", "😀😀!"}));
  EXPECT_EQ(qwen2_pre_tokenize("x１２"), (Pieces{"x", "１", "２"}));
  // Together the pieces are the text.
  const std::string text = "A  mix:\r\n\tof 3 things — 猫, 😀 & 'em'S\n";
  std::string joined;
  for (const auto& p : qwen2_pre_tokenize(text)) joined += p;
  EXPECT_EQ(joined, text);
  EXPECT_NE(error_of([] { qwen2_pre_tokenize("bad \xff byte"); }).find("UTF-8"), std::string::npos);
}

class Qwen2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new remat::testing::TempDir("qwen2_tokenizer");
    write_demo_qwen2_tokenizer(dir_->str());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static remat::testing::TempDir* dir_;
};
remat::testing::TempDir* Qwen2TokenizerTest::dir_ = nullptr;

TEST_F(Qwen2TokenizerTest, BpeIsLosslessAndMergesEverythingItCan) {
  const auto tokenizer = Qwen2Tokenizer::from_directory(dir_->str());
  EXPECT_GT(tokenizer.merge_count(), 200);
  const nlohmann::json file = nlohmann::json::parse(std::ifstream(dir_->str() + "/tokenizer.json"));
  std::set<std::string> merges;
  for (const auto& m : file["model"]["merges"]) merges.insert(m[0].get<std::string>() + " " + m[1].get<std::string>());
  for (const std::string text : {"a red square on a blue background", "It's a café — 22:00!", "一只红色的猫",
                                 "a smiling face 😀", "  spaces\n\nand lines  ", "Übergrößen", "ſ and 'S"}) {
    const auto ids = tokenizer.encode(text);
    EXPECT_EQ(tokenizer.decode(ids), text);
    // Within each piece, no two adjacent tokens form a merge: BPE stopped only when none applied.
    for (const auto& piece : qwen2_pre_tokenize(text)) {
      const auto tokens = tokenizer.tokenize(piece);
      for (size_t k = 0; k + 1 < tokens.size(); ++k) {
        EXPECT_FALSE(merges.count(tokens[k] + " " + tokens[k + 1])) << text << ": " << tokens[k] << tokens[k + 1];
      }
    }
  }
  // The corpus's words are single tokens by now; an unseen word is not.
  EXPECT_EQ(tokenizer.tokenize(" background").size(), 1u);
  EXPECT_GT(tokenizer.tokenize(" zebra").size(), 1u);
}

TEST_F(Qwen2TokenizerTest, SpecialTokensAreSplitOutAndNothingIsAdded) {
  const auto tokenizer = Qwen2Tokenizer::from_directory(dir_->str());
  const int64_t start = *tokenizer.token_id("<|im_start|>"), end = *tokenizer.token_id("<|im_end|>");
  EXPECT_GE(start, static_cast<int64_t>(256 + tokenizer.merge_count()) - 5);  // after the vocabulary
  const auto ids = tokenizer.encode("<|im_start|>system\nYou are<|im_end|>\n");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), start);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), end), 1);
  EXPECT_EQ(tokenizer.decode(ids), "<|im_start|>system\nYou are<|im_end|>\n");
  // The same text without the markers: no BOS or EOS appears.
  const auto plain = tokenizer.encode("system");
  EXPECT_EQ(tokenizer.decode(plain), "system");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), start) + std::count(plain.begin(), plain.end(), end), 0);
  EXPECT_TRUE(tokenizer.encode("").empty());
  // NFC: a decomposed é encodes as the composed one.
  EXPECT_EQ(tokenizer.encode("cafe\xcc\x81"), tokenizer.encode("caf\xc3\xa9"));
}

TEST_F(Qwen2TokenizerTest, OtherTokenizersAreRefusedByName) {
  const nlohmann::json good = nlohmann::json::parse(std::ifstream(dir_->str() + "/tokenizer.json"));
  const auto with = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = good;
    change(j);
    const std::string path = dir_->str() + "/changed.json";
    std::ofstream(path) << j.dump();
    return error_of([&] { Qwen2Tokenizer::from_file(path); });
  };
  EXPECT_NE(with([](auto& j) { j["model"]["type"] = "Unigram"; }).find("model.type is \"Unigram\""), std::string::npos);
  EXPECT_NE(with([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; })
                .find("not Qwen2's"),
            std::string::npos);
  EXPECT_NE(with([](auto& j) { j["normalizer"] = {{"type", "NFKC"}}; }).find("not NFC"), std::string::npos);
  EXPECT_NE(with([](auto& j) { j["model"]["continuing_subword_prefix"] = "##"; }).find("continuing_subword_prefix"),
            std::string::npos);
  EXPECT_NE(with([](auto& j) { j["model"]["merges"][0] = "a b c"; }).find("two symbols"), std::string::npos);
  EXPECT_NE(with([](auto& j) { j["added_tokens"][0]["single_word"] = true; }).find("single_word"), std::string::npos);
  const std::string message = with([](auto& j) { j["model"]["type"] = "WordPiece"; });
  EXPECT_NE(message.find("changed.json"), std::string::npos) << message;
  EXPECT_NE(message.find("Qwen2's byte-level BPE"), std::string::npos) << message;
  EXPECT_NE(error_of([&] { Qwen2Tokenizer::from_directory(dir_->str() + "/absent"); }).find("tokenizer.json"),
            std::string::npos);
}

}  // namespace qwen2_tokenizer_test
}  // namespace
}  // namespace remat::encoders
