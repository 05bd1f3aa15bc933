#include "remat/io/hub_cache.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "remat/util/error.h"

namespace remat::io {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// os.path.expanduser for the forms a cache variable takes: "~" and "~/...".
std::string expand_home(const std::string& path) {
  if (path.empty() || path[0] != '~' || (path.size() > 1 && path[1] != '/')) return path;
  const auto home = environment("HOME");
  return home ? *home + path.substr(1) : path;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

bool is_commit_hash(const std::string& revision) {
  return revision.size() == 40 &&
         std::all_of(revision.begin(), revision.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f'); });
}

// One part of a repo id: huggingface_hub's REPO_ID_REGEX, \b[\w\-.]{1,96}\b (ASCII words).
bool is_id_part(const std::string& part) {
  if (part.empty() || part.size() > 96) return false;
  for (char c : part) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  }
  auto edge = [](char c) { return c != '-' && c != '.'; };
  return edge(part.front()) && edge(part.back());
}

bool is_folder(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// huggingface_hub's repo_folder_name for a model: models--<org>--<name>.
std::string repository_folder_name(const std::string& repo_id) {
  const auto slash = repo_id.find('/');
  return "models--" + repo_id.substr(0, slash) + "--" + repo_id.substr(slash + 1);
}

// The repository folders for `repo_id`: the exact name first, then those equal to it ignoring case.
std::vector<fs::path> repository_folders(const fs::path& cache, const std::string& repo_id) {
  const std::string name = repository_folder_name(repo_id);
  std::vector<fs::path> found;
  if (is_folder(cache / name)) found.push_back(cache / name);
  std::error_code ec;
  std::vector<fs::path> others;
  for (fs::directory_iterator it(cache, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string entry = it->path().filename().string();
    if (entry != name && lower(entry) == lower(name) && is_folder(it->path())) others.push_back(it->path());
  }
  std::sort(others.begin(), others.end());
  found.insert(found.end(), others.begin(), others.end());
  return found;
}

std::optional<std::string> read_ref(const fs::path& ref) {
  std::error_code ec;
  if (!fs::is_regular_file(ref, ec)) return std::nullopt;
  std::ifstream in(ref);
  std::string commit;
  in >> commit;  // huggingface_hub writes the hash alone; whitespace around it is ignored
  return commit.empty() ? std::nullopt : std::optional<std::string>(commit);
}

std::string list(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

HubCacheLocation hub_cache_location() {
  if (auto v = environment("HF_HUB_CACHE")) return {expand_home(*v), "HF_HUB_CACHE"};
  if (auto v = environment("HUGGINGFACE_HUB_CACHE")) return {expand_home(*v), "HUGGINGFACE_HUB_CACHE"};
  if (auto v = environment("HF_HOME")) return {(fs::path(expand_home(*v)) / "hub").string(), "HF_HOME"};
  if (auto v = environment("XDG_CACHE_HOME")) {
    return {(fs::path(expand_home(*v)) / "huggingface" / "hub").string(), "XDG_CACHE_HOME"};
  }
  return {expand_home("~/.cache/huggingface/hub"), "the default"};
}

bool is_hub_model_id(const std::string& text) {
  const auto slash = text.find('/');
  if (slash == std::string::npos || text.find('/', slash + 1) != std::string::npos) return false;
  if (text.find("--") != std::string::npos || text.find("..") != std::string::npos) return false;
  if (text.size() >= 4 && text.compare(text.size() - 4, 4, ".git") == 0) return false;
  return is_id_part(text.substr(0, slash)) && is_id_part(text.substr(slash + 1));
}

std::string hub_download_command(const std::string& repo_id, const std::string& revision,
                                 const std::vector<std::string>& files) {
  std::string command = "hf download " + repo_id;
  for (const auto& f : files) command += " " + f;
  return command + " --revision " + revision;
}

HubSnapshot find_hub_snapshot(const std::string& repo_id, const std::string& revision,
                              const std::vector<std::string>& required_files, const std::string& component) {
  const std::string tag = "[" + component + "] ";
  if (!is_hub_model_id(repo_id)) {
    throw_value_error(tag + "'" + repo_id + "' is not a Hugging Face model id (org/name: letters, digits, '_', '-', '.')");
  }
  // A branch or tag is a path under refs/: nothing may lead out of it.
  const fs::path revision_path(revision);
  if (revision.empty() || revision_path.is_absolute() ||
      std::any_of(revision_path.begin(), revision_path.end(), [](const fs::path& part) { return part == ".." || part == "."; })) {
    throw_value_error(tag + "revision '" + revision + "' of " + repo_id +
                      " must be a branch, a tag or a commit hash (a name under refs/, without '.' or '..' parts)");
  }
  const HubCacheLocation cache = hub_cache_location();
  const std::string where = " in the Hugging Face cache " + cache.directory + " (chosen by " + cache.chosen_by +
                            "; HF_HUB_CACHE or HF_HOME select another)";
  const std::string fetch = "; remat does not download: fetch it with `" + hub_download_command(repo_id, revision) + "`";
  const std::vector<fs::path> folders = repository_folders(cache.directory, repo_id);
  if (folders.empty()) {
    throw_value_error(tag + repo_id + " (revision " + revision + ") is not" + where + ": looked for " +
                      (fs::path(cache.directory) / repository_folder_name(repo_id)).string() + " (any case)" + fetch);
  }
  // The revision in each matching folder, the first that has it.
  std::vector<std::string> looked;
  for (const fs::path& folder : folders) {
    std::string commit = revision;
    if (!is_commit_hash(revision)) {
      const fs::path ref = folder / "refs" / revision;
      const auto read = read_ref(ref);
      looked.push_back(ref.string());
      if (!read) continue;
      if (!is_commit_hash(*read)) {
        throw_value_error(tag + ref.string() + " holds '" + *read + "', not a commit hash: the cache entry is damaged; " +
                          "fetch it again with `" + hub_download_command(repo_id, revision) + "`");
      }
      commit = *read;
    }
    const fs::path snapshot = folder / "snapshots" / commit;
    looked.push_back(snapshot.string());
    if (!is_folder(snapshot)) continue;
    std::vector<std::string> missing;
    for (const auto& file : required_files) {
      std::error_code ec;
      if (!fs::is_regular_file(snapshot / file, ec)) missing.push_back(file);  // follows the blob symlink
    }
    if (!missing.empty()) {
      throw_value_error(tag + repo_id + " at revision " + revision + " (commit " + commit + ", snapshot " +
                        snapshot.string() + ") lacks " + list(missing) + "; remat does not download: fetch " +
                        (missing.size() == 1 ? "it" : "them") + " with `" +
                        hub_download_command(repo_id, revision, missing) + "`");
    }
    return HubSnapshot{repo_id, revision, commit, snapshot.string()};
  }
  throw_value_error(tag + repo_id + " has no revision " + revision + where + ": looked at " + list(looked) + fetch);
}

std::optional<HubSnapshot> hub_snapshot_unless_local(const std::string& path_or_id, const std::string& revision,
                                                     const std::vector<std::string>& required_files,
                                                     const std::string& component) {
  std::error_code ec;
  if (fs::exists(path_or_id, ec) || !is_hub_model_id(path_or_id)) return std::nullopt;
  return find_hub_snapshot(path_or_id, revision, required_files, component);
}

}  // namespace remat::io
