#pragma once
// File access from requests, confined to the workspace (Note [Confinement] in workspace.cpp).

#include <string>

namespace remat::ui::detail {

/// Throws c10::ValueError unless `name` is a config name: [A-Za-z0-9_.-]{1,100}, no "..", not
/// starting with '.'.
void check_config_name(const std::string& name);

/// <workspace>/configs/<name> (checked with check_config_name; not created).
std::string config_dir(const std::string& workspace, const std::string& name);

/// Whether the canonical path `path` is `root` or inside it (both canonical).
bool is_within(const std::string& root, const std::string& path);

/// The existing file `relative` names under the canonical directory `root`, canonical, after
/// refusing (c10::ValueError, "[ui] ...") an absolute path, a backslash, a NUL, a '%' left after
/// URL decoding (double-encoded forms), an empty, "." or ".." segment, and any path whose
/// symlinks lead outside `root`. A missing file: NotFound (the server answers 404).
std::string confined_existing_path(const std::string& root, const std::string& relative);

}  // namespace remat::ui::detail
