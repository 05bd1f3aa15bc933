// Files named by users (remat/util/files.h): folder identity by what a path resolves to,
// directories that cannot be made, temporaries left by killed writes, and excerpts of bytes that
// are not UTF-8.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "remat/util/bounded_json.h"
#include "remat/util/files.h"
#include "temp_dir.h"
#include "value_error.h"

namespace {
namespace files_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::TempDir;

TEST(CanonicalFolder, SpellingsOfOneFolderAreEqual) {
  TempDir dir;
  const fs::path x = fs::path(dir.path().string()) / "x";
  fs::create_directories(x);
  fs::create_directories(fs::path(dir.path().string()) / "a");
  fs::create_symlink(x, fs::path(dir.path().string()) / "x-link");
  const std::string want = remat::util::canonical_folder(x.string());
  for (const std::string& spelling : {x.string() + "/.", x.string() + "/", dir.path().string() + "/a/../x",
                                      dir.path().string() + "/x-link", dir.path().string() + "/./x-link/"}) {
    EXPECT_EQ(remat::util::canonical_folder(spelling), want) << spelling;
  }
  EXPECT_NE(remat::util::canonical_folder(dir.path().string() + "/y"), want);
  // A folder that does not exist yet resolves as far as it exists.
  EXPECT_EQ(remat::util::canonical_folder(dir.path().string() + "/x-link/new/.."), want);
}

TEST(MakeDirectories, NamesTheFileInTheWay) {
  TempDir dir;
  const std::string file = dir.path().string() + "/a-file";
  std::ofstream(file) << "x";
  const std::string message = remat::testing::error_text(
      [&] { remat::util::make_directories(file + "/sub/dir", "cache", "cache_dir_vae"); });
  EXPECT_EQ(message, "[cache] cache_dir_vae '" + file + "/sub/dir' cannot be created: '" + file +
                         "' is a file, not a directory");
  EXPECT_NE(remat::testing::error_text([&] { remat::util::make_directories(file, "cache", "cache_dir"); })
                .find("'" + file + "' is a file, not a directory"),
            std::string::npos);
  remat::util::make_directories(dir.path().string() + "/new/deeper", "cache", "cache_dir");
  EXPECT_TRUE(fs::is_directory(dir.path().string() + "/new/deeper"));
  remat::util::make_directories(dir.path().string() + "/new/deeper", "cache", "cache_dir");  // exists: fine
}

TEST(RemoveStaleTemporaries, RemovesOnlyThisDestinationsTemporaries) {
  TempDir dir;
  const std::string out = dir.path().string() + "/picture.png";
  for (const char* name : {".picture.png.tmp.AbC123", ".picture.png.tmp.zzzzzz", ".other.png.tmp.AbC123",
                           ".picture.png.tmp.toolong", "picture.png.tmp.AbC123"}) {
    std::ofstream(dir.path().string() + "/" + name) << "partial";
  }
  auto removed = remat::util::remove_stale_temporaries(out);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{dir.path().string() + "/.picture.png.tmp.AbC123",
                                               dir.path().string() + "/.picture.png.tmp.zzzzzz"}));
  EXPECT_TRUE(fs::exists(dir.path().string() + "/.other.png.tmp.AbC123"));
  EXPECT_TRUE(fs::exists(dir.path().string() + "/.picture.png.tmp.toolong"));
  EXPECT_TRUE(fs::exists(dir.path().string() + "/picture.png.tmp.AbC123"));
  // What write_file_atomically leaves on success is only the file.
  remat::util::write_file_atomically(out, "bytes", "test");
  EXPECT_TRUE(remat::util::remove_stale_temporaries(out).empty());
}

// AtomicFile: until commit() the destination keeps its old bytes; dropped uncommitted (an
// exception mid-write) it leaves nothing behind; committed, the whole new file is there, 0644.
TEST(AtomicFile, TheOldFileUntilCommitAndNoTemporaryLeft) {
  TempDir dir;
  const std::string out = dir.path().string() + "/weights.bin";
  const auto read = [&] {
    std::ifstream in(out, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto entries = [&] { return std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()); };
  remat::util::write_file_atomically(out, "old", "test");
  {
    remat::util::AtomicFile file(out, "test");
    file.write("new and longer", 14);
    EXPECT_EQ(read(), "old");
    EXPECT_EQ(entries(), 2);  // the destination and its temporary
  }
  EXPECT_EQ(read(), "old");
  EXPECT_EQ(entries(), 1);
  remat::util::AtomicFile file(out, "test");
  const std::string big(3 << 20, 'x');
  file.write(big.data(), big.size());
  file.commit();
  EXPECT_EQ(read(), big);
  EXPECT_EQ(entries(), 1);
  EXPECT_EQ(fs::status(out).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
  const std::string missing = dir.path().string() + "/no/such/x";
  const std::string message = remat::testing::error_text([&] { remat::util::AtomicFile(missing, "test"); });
  EXPECT_NE(message.find("[test] cannot write '" + missing + "': cannot create a temporary file"), std::string::npos)
      << message;
}

// nlohmann::json's dump() throws type_error 316 on bytes that are not UTF-8; an excerpt of a
// garbage file must still be quotable.
TEST(TextExcerpt, BytesThatAreNotUtf8BecomeEscapes) {
  const std::string garbage = "\xff\xfe ok \xc3\xa9 \xe2\x82";
  const std::string excerpt = remat::util::text_excerpt(garbage);
  EXPECT_EQ(excerpt, "\\xFF\\xFE ok \xc3\xa9 \\xE2\\x82");
  EXPECT_NO_THROW(nlohmann::json(excerpt).dump());
  EXPECT_EQ(remat::util::text_excerpt("\xed\xa0\x80"), "\\xED\\xA0\\x80");  // a surrogate is not UTF-8
}

}  // namespace files_test
}  // namespace
