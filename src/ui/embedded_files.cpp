#include "embedded_files.h"

namespace remat::ui::detail {

const EmbeddedFile* find_embedded_file(std::string_view name) {
  for (const auto& file : embedded_files()) {
    if (name == file.name) return &file;
  }
  return nullptr;
}

std::string content_type_of(std::string_view name) {
  const auto ends_with = [name](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  if (ends_with(".html")) return "text/html; charset=utf-8";
  if (ends_with(".js")) return "text/javascript; charset=utf-8";
  if (ends_with(".css")) return "text/css; charset=utf-8";
  if (ends_with(".json") || ends_with(".jsonl")) return "application/json";
  if (ends_with(".svg")) return "image/svg+xml";
  if (ends_with(".png")) return "image/png";
  if (ends_with(".jpg") || ends_with(".jpeg")) return "image/jpeg";
  if (ends_with(".webp")) return "image/webp";
  if (ends_with(".md") || ends_with(".txt") || ends_with(".log")) return "text/plain; charset=utf-8";
  return "application/octet-stream";
}

}  // namespace remat::ui::detail
