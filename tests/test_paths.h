#pragma once
// Paths the tests need from the build: the source tree (its docs and tests/data), the remat CLI and
// the ZeRO test worker. Defined in a file CMake generates (tests/CMakeLists.txt), so no test's
// compile command carries an absolute path and a clone in another folder reuses the compiler cache.

#include <string>

namespace remat::testing {

std::string source_dir();
std::string cli_path();
std::string zero_worker_path();

}  // namespace remat::testing
