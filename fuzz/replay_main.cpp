// A main() for the fuzz targets in builds without libFuzzer (gcc, sanitizer builds): runs every
// file given, or every file below each directory given, through LLVMFuzzerTestOneInput once.
// CTest uses it to replay the seed corpora and the regression inputs on every change.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void run_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  int files = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg = argv[i];
    if (!std::filesystem::exists(arg)) {
      std::fprintf(stderr, "no such file or directory: %s\n", argv[i]);
      return 1;
    }
    if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(arg)) {
        if (!entry.is_regular_file()) continue;
        run_file(entry.path());
        ++files;
      }
    } else {
      run_file(arg);
      ++files;
    }
  }
  std::printf("replayed %d inputs without a crash\n", files);
  return files > 0 ? 0 : 1;
}
