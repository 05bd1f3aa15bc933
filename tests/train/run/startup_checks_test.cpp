// Startup checks of a run's paths (remat/train/run/startup_checks.h): each bad path is a named
// ValidationError. Before them, an output_dir that was a file, a symlink loop in the data or
// output directory ended `remat train` with a raw `filesystem error` (exit 1), after the model and
// data had loaded.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "remat/train/options/config.h"
#include "remat/train/run/startup_checks.h"
#include "temp_dir.h"

namespace remat::train {
namespace {
namespace startup_checks_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)
namespace fs = std::filesystem;

template <class Fn>
std::pair<std::string, std::string> error_of(Fn fn) {
  try {
    fn();
  } catch (const ValidationError& e) {
    return {e.option(), e.what()};
  }
  ADD_FAILURE() << "expected a ValidationError";
  return {};
}

TEST(StartupChecks, OutputDirMustBeAWritableDirectory) {
  remat::testing::TempDir dir("remat_startup");
  std::ofstream(dir / "file") << "x";
  fs::create_symlink(dir.path() / "loop", dir.path() / "loop");
  const auto file = error_of([&] { check_output_dir(dir / "file"); });
  EXPECT_EQ(file.first, "output_dir");
  EXPECT_NE(file.second.find("output_dir must be a writable directory, got '" + (dir / "file") +
                             "': it is not a directory"),
            std::string::npos)
      << file.second;
  EXPECT_NE(error_of([&] { check_output_dir(dir / "file/sub"); }).second.find("Not a directory"), std::string::npos);
  EXPECT_NE(error_of([&] { check_output_dir(dir / "loop"); }).second.find("Too many levels of symbolic links"),
            std::string::npos);
  check_output_dir(dir / "new/nested");  // created
  EXPECT_TRUE(fs::is_directory(dir.path() / "new/nested"));
  EXPECT_TRUE(fs::is_empty(dir.path() / "new/nested"));  // the write probe is removed
}

TEST(StartupChecks, DataDirAndOutputFiles) {
  remat::testing::TempDir dir("remat_startup");
  std::ofstream(dir / "file") << "x";
  fs::create_symlink(dir.path() / "loop", dir.path() / "loop");
  const auto loop = error_of([&] { check_data_dir(dir / "loop"); });
  EXPECT_EQ(loop.first, "instance_data_dir");
  EXPECT_NE(loop.second.find("Too many levels of symbolic links"), std::string::npos) << loop.second;
  EXPECT_NE(error_of([&] { check_data_dir(dir / "file"); }).second.find("it is not a directory"), std::string::npos);
  EXPECT_NE(error_of([&] { check_data_dir(dir / "missing"); }).second.find("No such file"), std::string::npos);
  EXPECT_NO_THROW(check_data_dir(dir.str()));

  // `remat bench --json DIR` once failed only after the whole run.
  const auto directory = error_of([&] { check_output_file(dir.str(), "--json"); });
  EXPECT_EQ(directory.first, "--json");
  EXPECT_NE(directory.second.find("--json must be a file in a writable directory, got '" + dir.str() + "': it is a directory"),
            std::string::npos)
      << directory.second;
  EXPECT_NE(error_of([&] { check_output_file(dir / "missing/out.json", "--json"); }).second.find("No such file"),
            std::string::npos);
  EXPECT_NO_THROW(check_output_file(dir / "out.json", "--json"));
  EXPECT_FALSE(fs::exists(dir.path() / "out.json"));
}

}  // namespace startup_checks_test
}  // namespace
}  // namespace remat::train
