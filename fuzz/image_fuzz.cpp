// Fuzz target: one picture file (any format: the readers tell it by its first bytes), its header
// read, its pixels decoded upright, then resized to a third of each side as the bucketing does.
#include <cstddef>
#include <cstdint>

#include <c10/util/Exception.h>

#include "fuzz_input_file.h"
#include "remat/image/image_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = remat::fuzz::write_input(data, size, "picture");
  try {
    const auto info = remat::image::read_image_info(path);
    (void)info;
  } catch (const c10::Error&) {
  }
  try {
    const auto picture = remat::image::read_image(path);
    // Pictures stay small here: the fuzzer's inputs are, and kMaxImagePixels bounds the rest.
    if (picture.size(0) * picture.size(1) <= 512 * 512) {
      (void)remat::image::resize_picture(picture, picture.size(1) / 3 + 1, picture.size(0) / 3 + 1);
    }
  } catch (const c10::Error&) {
  }
  return 0;
}
