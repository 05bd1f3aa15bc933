#include "workspace.h"

#include "api.h"

#include <filesystem>

#include "remat/util/error.h"
#include "remat/util/bounded_json.h"

// Note [Confinement]
// Every file a request names is relative to a directory of the workspace (a config's folder, a
// run's output_dir). The request path has been URL-decoded once by httplib, so "%2e%2e/" arrives
// as "../" and is refused with the literal form; a '%' still present means an encoding was
// encoded again ("%252e"): no legitimate file name of ours has one, so it is refused rather than
// guessed at. Absolute paths, backslashes and NULs are refused outright. Then the path is
// resolved with every symlink followed and must still be inside the (canonical) root: a symlink
// pointing out, anywhere on the way, is refused. Names are checked before the file system is
// touched, so a refused path leaks nothing about what exists.

namespace remat::ui::detail {
namespace fs = std::filesystem;

void check_config_name(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 100 && name.front() != '.' && name.find("..") == std::string::npos;
  for (char c : name) {
    const bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                         c == '.' || c == '-';
    ok = ok && allowed;
  }
  if (!ok) {
    throw_value_error("[ui] a config name must be 1 to 100 of A-Z a-z 0-9 _ . - (not starting with '.', no "
                      "'..'), got '" + util::text_excerpt(name) + "'");
  }
}

std::string config_dir(const std::string& workspace, const std::string& name) {
  check_config_name(name);
  return (fs::path(workspace) / "configs" / name).string();
}

bool is_within(const std::string& root, const std::string& path) {
  if (path == root) return true;
  const std::string prefix = root.back() == '/' ? root : root + "/";
  return path.compare(0, prefix.size(), prefix) == 0;
}

std::string confined_existing_path(const std::string& root, const std::string& relative) {
  const auto refuse = [&relative](const std::string& why) {
    throw_value_error("[ui] file paths must stay inside the workspace: '" + util::text_excerpt(relative) + "' " + why);
  };
  if (relative.empty()) refuse("is empty");
  if (relative.front() == '/') refuse("is absolute");
  if (relative.find('\\') != std::string::npos) refuse("has a backslash");
  if (relative.find('\0') != std::string::npos) refuse("has a NUL byte");
  if (relative.find('%') != std::string::npos) refuse("is still percent-encoded after decoding");
  size_t begin = 0;
  while (begin <= relative.size()) {
    size_t end = relative.find('/', begin);
    if (end == std::string::npos) end = relative.size();
    const std::string segment = relative.substr(begin, end - begin);
    if (segment.empty() || segment == "." || segment == "..") refuse("has an empty, '.' or '..' segment");
    begin = end + 1;
  }
  std::error_code ec;
  const fs::path resolved = fs::canonical(fs::path(root) / relative, ec);
  if (ec) throw NotFound("[ui] no such file: '" + util::text_excerpt(relative) + "'");
  if (!is_within(root, resolved.string())) refuse("leads outside it through a symlink");
  return resolved.string();
}

}  // namespace remat::ui::detail
