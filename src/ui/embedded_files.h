#pragma once
// The files compiled into the binary by cmake/embed_files.cmake: the page (src/ui/assets/*) and
// the translated checkpointing help (docs/OPTIONS.<lang>.md), so `remat ui` needs no file on disk.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace remat::ui::detail {

struct EmbeddedFile {
  const char* name;  ///< "index.html", "app.js", "help/OPTIONS.zh.md"
  const unsigned char* data;
  size_t size;
  std::string_view bytes() const { return {reinterpret_cast<const char*>(data), size}; }
};

/// Every embedded file (defined in the generated embedded_files.cpp).
const std::vector<EmbeddedFile>& embedded_files();

/// The file called `name`, or nullptr.
const EmbeddedFile* find_embedded_file(std::string_view name);

/// The Content-Type of a served file, by its extension.
std::string content_type_of(std::string_view name);

}  // namespace remat::ui::detail
