#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "remat/encoders/t5_tokenizer.h"
#include "temp_dir.h"
#include "value_error.h"

// The T5 tokenizer on a real SentencePiece unigram model trained here (train_tiny_spiece_model),
// in the same process as LibTorch: loading SentencePiece at all is part of what is tested (Note
// [SentencePiece isolation]). Expected values follow from T5's rules (eos 1 appended, pad 0,
// truncation keeping eos last), not from recorded outputs. ctest runs each test in a process of its
// own, side by side: every file lives in a directory of the process's own (TempDir), never at a
// fixed name another process could remove or rewrite mid-test.

namespace {
namespace t5_tokenizer_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::encoders::T5Encoding;
using remat::encoders::T5Tokenizer;
using remat::testing::error_of;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class T5TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<remat::testing::TempDir>("t5_tokenizer_test");
    remat::encoders::train_tiny_spiece_model(model_path());
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static std::string temp(const std::string& name) { return *dir_ / name; }
  static std::string model_path() { return temp("spiece.model"); }
  static std::unique_ptr<remat::testing::TempDir> dir_;
};
std::unique_ptr<remat::testing::TempDir> T5TokenizerTest::dir_;

TEST_F(T5TokenizerTest, TrainedModelHasT5SpecialPieces) {
  const auto tok = T5Tokenizer::from_file(model_path());
  EXPECT_EQ(tok.id_to_piece(0), "<pad>");
  EXPECT_EQ(tok.id_to_piece(1), "</s>");
  EXPECT_EQ(tok.id_to_piece(2), "<unk>");
  EXPECT_GT(tok.vocab_size(), 100 + 20);
  EXPECT_LE(tok.vocab_size(), 100 + 120);
  EXPECT_EQ(tok.id_to_piece(tok.vocab_size() - 1), "<extra_id_0>");
  EXPECT_EQ(tok.id_to_piece(tok.vocab_size() - 100), "<extra_id_99>");
}

TEST_F(T5TokenizerTest, TrainingIsDeterministic) {
  const std::string again = temp("again.model");
  remat::encoders::train_tiny_spiece_model(again);
  EXPECT_EQ(read_bytes(again), read_bytes(model_path()));
  std::remove(again.c_str());
}

TEST_F(T5TokenizerTest, AppendsEosAndPadsToMaxLength) {
  const auto tok = T5Tokenizer::from_file(model_path());
  const std::string caption = "a red square on a blue background";
  const std::vector<int64_t> content = tok.encode_ids(caption);
  ASSERT_FALSE(content.empty());
  for (int64_t id : content) EXPECT_GE(id, 3);  // every word of the training corpus is known
  const T5Encoding e = tok.encode(caption, 24);
  ASSERT_EQ(e.ids.size(), 24u);
  ASSERT_EQ(e.attention_mask.size(), 24u);
  const size_t n = content.size();
  ASSERT_LT(n + 1, 24u);
  EXPECT_TRUE(std::equal(content.begin(), content.end(), e.ids.begin()));
  EXPECT_EQ(e.ids[n], T5Tokenizer::kEosId);
  for (size_t i = n + 1; i < 24; ++i) EXPECT_EQ(e.ids[i], T5Tokenizer::kPadId) << i;
  for (size_t i = 0; i < 24; ++i) EXPECT_EQ(e.attention_mask[i], i <= n ? 1 : 0) << i;
  EXPECT_EQ(e.removed_text, "");
  EXPECT_EQ(tok.decode(e.ids), caption);
  EXPECT_EQ(tok.decode({e.ids.begin(), e.ids.begin() + n + 2}, false), caption + "</s><pad>");
}

TEST_F(T5TokenizerTest, TruncatesKeepingEosLastAndReportsTheRemovedText) {
  const auto tok = T5Tokenizer::from_file(model_path());
  const std::string caption =
      "a green circle on a white background and a red square on a blue background and a "
      "yellow triangle on a black background";
  const std::vector<int64_t> content = tok.encode_ids(caption);
  const int64_t max_length = 12;
  ASSERT_GT(static_cast<int64_t>(content.size()), max_length);
  const T5Encoding e = tok.encode(caption, max_length);
  ASSERT_EQ(e.ids.size(), 12u);
  EXPECT_TRUE(std::equal(content.begin(), content.begin() + 11, e.ids.begin()));
  EXPECT_EQ(e.ids[11], T5Tokenizer::kEosId);
  EXPECT_EQ(e.attention_mask, std::vector<int64_t>(12, 1));
  // The removed part is the decoded tail of the content: the caption ends with it.
  ASSERT_FALSE(e.removed_text.empty());
  EXPECT_EQ(e.removed_text, tok.decode({content.begin() + 11, content.end()}));
  EXPECT_EQ(caption.substr(caption.size() - e.removed_text.size()), e.removed_text) << e.removed_text;
  EXPECT_EQ(remat::encoders::t5_truncation_warning(512, "x y"),
            "The following part of your input was truncated because `max_sequence_length` is set "
            "to 512 tokens: x y");
  // Exactly max_length - 1 content ids: nothing is cut.
  const T5Encoding fits = tok.encode(caption, static_cast<int64_t>(content.size()) + 1);
  EXPECT_EQ(fits.removed_text, "");
  EXPECT_EQ(fits.ids.back(), T5Tokenizer::kEosId);
  // max_length 1: only eos.
  EXPECT_EQ(tok.encode(caption, 1).ids, std::vector<int64_t>{T5Tokenizer::kEosId});
  EXPECT_NE(error_of([&] { tok.encode(caption, 0); }).find("max_length must be >= 1"), std::string::npos);
}

TEST_F(T5TokenizerTest, NormalisesWhitespaceAndUnicode) {
  const auto tok = T5Tokenizer::from_file(model_path());
  EXPECT_EQ(tok.encode_ids("   a  red\tsquare \n "), tok.encode_ids("a red square"));
  // NFKC: full-width letters are the ASCII ones.
  EXPECT_EQ(tok.encode_ids("\xEF\xBD\x81 red"), tok.encode_ids("a red"));  // U+FF41
  // Characters never seen in training are <unk>; a run of them is one <unk>.
  const auto unknown = tok.encode_ids("a \xE2\x98\x83\xE2\x98\x83\xF0\x9F\x99\x82 red");  // ☃☃🙂
  EXPECT_EQ(std::count(unknown.begin(), unknown.end(), T5Tokenizer::kUnkId), 1);
  const auto a = tok.encode_ids("a"), red = tok.encode_ids("red");
  EXPECT_EQ(unknown.front(), a.front());
  EXPECT_EQ(unknown.back(), red.back());
  EXPECT_EQ(tok.encode("", 4).ids, (std::vector<int64_t>{1, 0, 0, 0}));
}

TEST_F(T5TokenizerTest, SpecialTokenStringsMapToTheirIds) {
  const auto tok = T5Tokenizer::from_file(model_path());
  const auto ids = tok.encode_ids("a<extra_id_0> red</s>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.back(), T5Tokenizer::kEosId);
  EXPECT_NE(std::find(ids.begin(), ids.end(), tok.vocab_size() - 1), ids.end());
  // A caption already ending in </s> gets no second one.
  const auto e = tok.encode("a red</s>", 8);
  EXPECT_EQ(std::count(e.ids.begin(), e.ids.end(), T5Tokenizer::kEosId), 1);
  // transformers' convert_tokens_to_string: a space before a run of special tokens, none after
  // (SentencePiece drops the "▁" that starts the next run), then strip.
  EXPECT_EQ(tok.decode(tok.encode_ids("a <extra_id_7> red"), false), "a<extra_id_7>red");
  EXPECT_EQ(tok.decode(tok.encode_ids("a <extra_id_7> red")), "a red");
  // Only <extra_id_0> ... <extra_id_99> exist: "<extra_id_100>" is ordinary text.
  const auto not_special = tok.encode_ids("<extra_id_100>");
  for (int64_t id : not_special) EXPECT_LT(id, tok.vocab_size() - 100);
}

TEST_F(T5TokenizerTest, CorruptOrMissingModelFilesAreNamed) {
  const std::string bad = temp("corrupt.model");
  std::ofstream(bad, std::ios::binary) << "this is not a protobuf \x01\x02\x03";
  const std::string message = error_of([&] { T5Tokenizer::from_file(bad); });
  EXPECT_EQ(message.rfind("[t5-tokenizer] '" + bad + "' is not a valid SentencePiece model", 0), 0u) << message;
  // A truncated real model.
  const std::string bytes = read_bytes(model_path());
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  EXPECT_NE(error_of([&] { T5Tokenizer::from_file(bad); }).find(bad), std::string::npos);
  std::remove(bad.c_str());
  const std::string missing = error_of([&] { T5Tokenizer::from_file(bad); });
  EXPECT_NE(missing.find(bad), std::string::npos) << missing;
  EXPECT_EQ(missing.rfind("[t5-tokenizer]", 0), 0u) << missing;
}

}  // namespace t5_tokenizer_test
}  // namespace
