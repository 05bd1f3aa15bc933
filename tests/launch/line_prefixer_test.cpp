// Whole, prefixed lines from a stream cut anywhere: the same text fed byte by byte and in one
// piece gives the same lines.
#include <gtest/gtest.h>

#include "launch/line_prefixer.h"

namespace remat::cli::launch {
namespace {
namespace line_prefixer_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

std::string feed_bytewise(LinePrefixer& prefixer, const std::string& text) {
  std::string out;
  for (char c : text) out += prefixer.feed(&c, 1);
  return out + prefixer.finish();
}

std::string feed_whole(LinePrefixer& prefixer, const std::string& text) {
  std::string out = prefixer.feed(text.data(), text.size());
  return out + prefixer.finish();  // in this order: operands of + are evaluated in any order
}

TEST(LinePrefixer, PrefixesWholeLinesOnlyAndKeepsEmptyOnes) {
  LinePrefixer prefixer("[rank1]: ");
  EXPECT_EQ(prefixer.feed("ab", 2), "");
  EXPECT_EQ(prefixer.feed("c\nd", 3), "[rank1]: abc\n");
  EXPECT_EQ(prefixer.feed("\n\n", 2), "[rank1]: d\n[rank1]: \n");
  EXPECT_EQ(prefixer.feed("tail", 4), "");
  EXPECT_EQ(prefixer.finish(), "[rank1]: tail\n");
  EXPECT_EQ(prefixer.finish(), "");
}

TEST(LinePrefixer, CarriageReturnsEndLinesAndCrLfIsOneEnd) {
  const std::string text = "\r 10%\r 20%\r 30%\ndone\r\nnext\r\n\r\nlast";
  const std::string expected = "[r]:  10%\n[r]:  20%\n[r]:  30%\n[r]: done\n[r]: next\n[r]: \n[r]: last\n";
  LinePrefixer a("[r]: "), b("[r]: ");
  EXPECT_EQ(feed_whole(a, text), expected);
  EXPECT_EQ(feed_bytewise(b, text), expected);  // a "\r\n" split between two reads too
}

TEST(LinePrefixer, LongLinesAreCutAtTheLimit) {
  LinePrefixer prefixer("> ", 4);
  EXPECT_EQ(feed_whole(prefixer, "abcdefgh\nij\n"), "> abcd\n> efgh\n> ij\n");
  LinePrefixer crlf("> ", 4);
  EXPECT_EQ(feed_bytewise(crlf, "abcd\r\nef\r\n\n"), "> abcd\n> ef\n> \n");
}

}  // namespace line_prefixer_test
}  // namespace
}  // namespace remat::cli::launch
