#include "atomic_text_file.h"

#include "remat/io/files.h"

namespace remat::encoders {

void write_text_file_atomically(const std::string& path, const std::string& text, const std::string& component) {
  io::write_file_atomically(path, text, component);
}

}  // namespace remat::encoders
