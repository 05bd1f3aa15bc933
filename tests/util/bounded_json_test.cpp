// The bounded JSON policy (remat/util/bounded_json.h) and the regular-file checks (remat/util/files.h):
// deep or huge JSON is refused before parsing, excerpts stay short whatever the value, and a FIFO
// never blocks an open.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <fstream>

#include <nlohmann/json.hpp>

#include "remat/util/bounded_json.h"
#include "remat/util/files.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::util {
namespace {
namespace bounded_json_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

std::string nested(size_t depth, const std::string& inner = "1") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

using remat::testing::error_of;

TEST(BoundedJson, DepthAndSizeAreCheckedBeforeParsing) {
  EXPECT_NO_THROW(check_json_text(nested(kMaxJsonDepth), 1 << 20, "[test] doc"));
  const std::string deep = error_of([] { check_json_text(nested(100000), 1 << 20, "[test] doc"); });
  EXPECT_NE(deep.find("[test] doc nests arrays and objects deeper than 64 levels (at byte 64)"), std::string::npos)
      << deep;
  // Brackets inside strings, escaped quotes included, are text, not nesting.
  EXPECT_NO_THROW(check_json_text("{\"k\": \"" + std::string(1000, '[') + "\\\"[[\"}", 1 << 20, "[test] doc"));
  const std::string large = error_of([] { check_json_text(std::string(101, ' '), 100, "[test] doc"); });
  EXPECT_NE(large.find("[test] doc is too large for a JSON document: 101 bytes, at most 100"), std::string::npos)
      << large;
}

// A message quoting a value walks at most kExcerptDepth levels and kExcerptChars characters: a
// 100k-deep value (built in code: the parser never produces one) does not recurse 100k times.
TEST(BoundedJson, ExcerptsAreBoundedWhateverTheValue) {
  nlohmann::json deep = nlohmann::json::array();
  nlohmann::json* innermost = &deep;  // built in place: copying a deep value would recurse
  for (int i = 0; i < 100000; ++i) {
    innermost->push_back(nlohmann::json::array());
    innermost = &innermost->back();
  }
  EXPECT_EQ(json_excerpt(deep), "[[[[[...]]]]]");
  const nlohmann::json wide = nlohmann::json::array({std::string(1 << 20, 'x'), 1, 2});
  const std::string w = json_excerpt(wide);
  EXPECT_LE(w.size(), kExcerptChars + 3);
  EXPECT_EQ(w.substr(w.size() - 3), "...");
  EXPECT_EQ(json_excerpt(nlohmann::json::parse(R"({"a":[1,2],"b":"c"})")), R"({"a":[1,2],"b":"c"})");
  EXPECT_EQ(text_excerpt(std::string(200, 'y'), 4), "yyyy... (200 bytes)");
}

TEST(Files, FifoIsRefusedWithoutBlocking) {
  remat::testing::TempDir dir("remat_files");
  const std::string fifo = dir / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string read = error_of([&] { read_regular_file(fifo, 1 << 20, "test", "config"); });
  EXPECT_NE(read.find("[test] config must be a regular file, got '" + fifo + "' (a FIFO)"), std::string::npos) << read;
  const std::string check = error_of([&] { require_regular_file(fifo, "test", "--weights"); });
  EXPECT_NE(check.find("--weights must be a regular file"), std::string::npos) << check;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  const std::string big = dir / "big.json";
  std::ofstream(big) << std::string(100, ' ');
  EXPECT_NE(error_of([&] { read_regular_file(big, 99, "test", "config"); }).find("is too large: 100 bytes, at most 99"),
            std::string::npos);
  EXPECT_EQ(read_regular_file(big, 100, "test", "config").size(), 100u);
  EXPECT_NE(error_of([&] { read_regular_file(dir.str(), 100, "test", "config"); }).find("(a directory)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { require_regular_file(dir / "missing", "test", "--weights"); }).find("No such file"),
            std::string::npos);
}

}  // namespace bounded_json_test
}  // namespace
}  // namespace remat::util
