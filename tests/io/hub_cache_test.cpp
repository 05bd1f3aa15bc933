// The hub cache lookup against a cache built here in huggingface_hub's layout (refs/, snapshots/
// of symlinks into blobs/), two revisions, and the environment variables that move it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "remat/io/hub_cache.h"
#include "scoped_environment.h"
#include "temp_dir.h"
#include "value_error.h"

namespace {
namespace hub_cache_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::io::find_hub_snapshot;
using remat::io::hub_cache_location;
using remat::io::is_hub_model_id;
using remat::testing::error_of;
using remat::testing::ScopedEnvironment;
using remat::testing::TempDir;

const std::string kCommitA(40, 'a');
const std::string kCommitB = "0123456789abcdef0123456789abcdef01234567";

// A file of the snapshot as huggingface_hub stores it: the bytes in blobs/, a relative symlink.
void add_file(const fs::path& repo, const std::string& commit, const std::string& name, const std::string& bytes) {
  const fs::path blob = repo / "blobs" / (commit.substr(0, 8) + "-" + std::to_string(std::hash<std::string>{}(name)));
  fs::create_directories(blob.parent_path());
  std::ofstream(blob) << bytes;
  const fs::path link = repo / "snapshots" / commit / name;
  fs::create_directories(link.parent_path());
  fs::create_symlink(fs::relative(blob, link.parent_path()), link);
}

void add_ref(const fs::path& repo, const std::string& name, const std::string& commit) {
  fs::create_directories((repo / "refs" / name).parent_path());
  std::ofstream(repo / "refs" / name) << commit;  // no newline, as huggingface_hub writes it
}

class HubCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_ = fs::path(cache_.str()) / "models--Org--Model.One";
    add_file(repo_, kCommitA, "model_index.json", "{}");
    add_file(repo_, kCommitA, "transformer/config.json", "{\"a\": 1}");
    add_file(repo_, kCommitB, "model_index.json", "{}");
    add_ref(repo_, "main", kCommitA);
    add_ref(repo_, "v2", kCommitB);
  }

  TempDir cache_{"hub_cache_test"};
  fs::path repo_;
  ScopedEnvironment env_{{{"HF_HUB_CACHE", cache_.str()}, {"HUGGINGFACE_HUB_CACHE", std::nullopt}}};
};

TEST_F(HubCacheTest, RevisionsResolveThroughRefsOrAsCommits) {
  const auto main = find_hub_snapshot("Org/Model.One", "main", {"model_index.json", "transformer/config.json"});
  EXPECT_EQ(main.commit, kCommitA);
  EXPECT_EQ(fs::path(main.directory), repo_ / "snapshots" / kCommitA);
  EXPECT_EQ(main.repo_id, "Org/Model.One");
  EXPECT_EQ(main.revision, "main");
  const auto tag = find_hub_snapshot("Org/Model.One", "v2");
  EXPECT_EQ(tag.commit, kCommitB);
  const auto commit = find_hub_snapshot("Org/Model.One", kCommitB, {"model_index.json"});
  EXPECT_EQ(fs::path(commit.directory), repo_ / "snapshots" / kCommitB);
  // The file read through the snapshot is the blob's.
  std::ifstream in(fs::path(main.directory) / "transformer" / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "{\"a\": 1}");
}

TEST_F(HubCacheTest, LocalPathsWinOverIds) {
  using remat::io::hub_snapshot_unless_local;
  EXPECT_EQ(hub_snapshot_unless_local("Org/Model.One", "main")->commit, kCommitA);
  EXPECT_FALSE(hub_snapshot_unless_local(cache_.str(), "main").has_value());  // exists
  EXPECT_FALSE(hub_snapshot_unless_local("a/b/c", "main").has_value());       // not an id
  // An id-shaped relative path that exists is a local path.
  const fs::path before = fs::current_path();
  fs::current_path(cache_.str());
  fs::create_directories("Org/Model.One");
  EXPECT_FALSE(hub_snapshot_unless_local("Org/Model.One", "main").has_value());
  fs::current_path(before);
  EXPECT_NE(error_of([] { hub_snapshot_unless_local("org/absent", "main"); }).find("is not in the Hugging Face cache"),
            std::string::npos);
}

TEST_F(HubCacheTest, IdsMatchIgnoringCaseExactFirst) {
  EXPECT_EQ(find_hub_snapshot("org/model.one", "main").commit, kCommitA);
  EXPECT_EQ(find_hub_snapshot("ORG/MODEL.ONE", "v2").commit, kCommitB);
  // A second folder differing only in case: the exact name wins, the other is still found by its own.
  const fs::path lower = fs::path(cache_.str()) / "models--org--model.one";
  add_file(lower, kCommitB, "model_index.json", "{}");
  add_ref(lower, "main", kCommitB);
  EXPECT_EQ(find_hub_snapshot("Org/Model.One", "main").commit, kCommitA);
  EXPECT_EQ(find_hub_snapshot("org/model.one", "main").commit, kCommitB);
}

TEST_F(HubCacheTest, MissingPiecesNameWhatWasLookedAtAndTheFetchCommand) {
  const std::string repo = error_of([] { find_hub_snapshot("org/absent", "main"); });
  EXPECT_EQ(repo.rfind("[hub] org/absent (revision main) is not in the Hugging Face cache " + cache_.str(), 0), 0u)
      << repo;
  EXPECT_NE(repo.find((fs::path(cache_.str()) / "models--org--absent").string() + " (any case)"), std::string::npos)
      << repo;
  EXPECT_NE(repo.find("chosen by HF_HUB_CACHE"), std::string::npos) << repo;
  EXPECT_NE(repo.find("`hf download org/absent --revision main`"), std::string::npos) << repo;

  const std::string revision = error_of([] { find_hub_snapshot("Org/Model.One", "v3", {}, "train"); });
  EXPECT_EQ(revision.rfind("[train] Org/Model.One has no revision v3", 0), 0u) << revision;
  EXPECT_NE(revision.find((repo_ / "refs" / "v3").string()), std::string::npos) << revision;
  EXPECT_NE(revision.find("`hf download Org/Model.One --revision v3`"), std::string::npos) << revision;

  for (const std::string bad : {"", "../../etc", "/abs", "refs/../main"}) {
    const std::string message = error_of([&] { find_hub_snapshot("Org/Model.One", bad); });
    EXPECT_EQ(message.rfind("[hub] revision '" + bad +
                                "' of Org/Model.One must be a branch, a tag or a commit hash (a name under refs/, "
                                "without '.' or '..' parts)",
                            0),
              0u)
        << message;
  }

  // A ref that does not hold a commit hash (a damaged entry) is named, never followed.
  add_ref(repo_, "damaged", "../../../elsewhere");
  const std::string damaged = error_of([] { find_hub_snapshot("Org/Model.One", "damaged"); });
  EXPECT_EQ(damaged.rfind("[hub] " + (repo_ / "refs" / "damaged").string() +
                              " holds '../../../elsewhere', not a commit hash: the cache entry is damaged",
                          0),
            0u)
      << damaged;

  const std::string commit = error_of([] { find_hub_snapshot("Org/Model.One", std::string(40, 'c')); });
  EXPECT_NE(commit.find((repo_ / "snapshots" / std::string(40, 'c')).string()), std::string::npos) << commit;

  // A file the revision lacks, and one whose blob is gone (an interrupted or pruned download).
  fs::remove(repo_ / "blobs" / fs::read_symlink(repo_ / "snapshots" / kCommitA / "model_index.json").filename());
  const std::string files =
      error_of([] { find_hub_snapshot("Org/Model.One", "main", {"model_index.json", "vae/config.json", "transformer/config.json"}); });
  EXPECT_EQ(files.rfind("[hub] Org/Model.One at revision main (commit " + kCommitA + ", snapshot " +
                            (repo_ / "snapshots" / kCommitA).string() + ") lacks model_index.json, vae/config.json;",
                        0),
            0u)
      << files;
  EXPECT_NE(files.find("`hf download Org/Model.One model_index.json vae/config.json --revision main`"), std::string::npos)
      << files;
}

TEST(HubCacheLocation, FollowsHuggingfaceHubsPrecedence) {
  const std::map<std::string, std::optional<std::string>> none = {{"HF_HUB_CACHE", std::nullopt},
                                                                  {"HUGGINGFACE_HUB_CACHE", std::nullopt},
                                                                  {"HF_HOME", std::nullopt},
                                                                  {"XDG_CACHE_HOME", std::nullopt},
                                                                  {"HOME", "/home/someone"}};
  {
    ScopedEnvironment env(none);
    EXPECT_EQ(hub_cache_location().directory, "/home/someone/.cache/huggingface/hub");
    EXPECT_EQ(hub_cache_location().chosen_by, "the default");
  }
  auto with = [&](const std::map<std::string, std::optional<std::string>>& set) {
    auto values = none;
    for (const auto& [k, v] : set) values[k] = v;
    return values;
  };
  {
    ScopedEnvironment env(with({{"XDG_CACHE_HOME", "/xdg"}}));
    EXPECT_EQ(hub_cache_location().directory, "/xdg/huggingface/hub");
  }
  {
    ScopedEnvironment env(with({{"XDG_CACHE_HOME", "/xdg"}, {"HF_HOME", "~/hf"}}));
    EXPECT_EQ(hub_cache_location().directory, "/home/someone/hf/hub");
    EXPECT_EQ(hub_cache_location().chosen_by, "HF_HOME");
  }
  {
    ScopedEnvironment env(with({{"HF_HOME", "/hf"}, {"HUGGINGFACE_HUB_CACHE", "/legacy"}}));
    EXPECT_EQ(hub_cache_location().directory, "/legacy");
  }
  {
    ScopedEnvironment env(with({{"HF_HOME", "/hf"}, {"HUGGINGFACE_HUB_CACHE", "/legacy"}, {"HF_HUB_CACHE", "/new"}}));
    EXPECT_EQ(hub_cache_location().directory, "/new");
    EXPECT_EQ(hub_cache_location().chosen_by, "HF_HUB_CACHE");
  }
}

TEST(HubModelId, FollowsHuggingfaceHubsValidator) {
  for (const char* id : {"black-forest-labs/FLUX.1-dev", "org/name", "a/b", "under_score/x.y-z", "1/2"}) {
    EXPECT_TRUE(is_hub_model_id(id)) << id;
  }
  for (const char* id : {"name", "a/b/c", "/abs/path", "./dir", "org/", "/name", "org/-name", "org/name.",
                         "org/na--me", "org/na..me", "org/name.git", "org/na me", "org/ünï", "../x"}) {
    EXPECT_FALSE(is_hub_model_id(id)) << id;
  }
  EXPECT_FALSE(is_hub_model_id("org/" + std::string(97, 'x')));
  EXPECT_TRUE(is_hub_model_id("org/" + std::string(96, 'x')));
}

}  // namespace hub_cache_test
}  // namespace
