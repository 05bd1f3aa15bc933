#pragma once
/// \file
/// Models in the local Hugging Face hub cache, found offline. A SimpleTuner user names a model by
/// its hub id ("black-forest-labs/FLUX.1-dev"); diffusers' from_pretrained then reads the copy that
/// `hf download` (or any earlier run) left in the cache. remat reads the same copy and never
/// downloads: a missing repository, revision or file is an error that says where it looked and the
/// command that fetches what is missing.
///
/// The layout is huggingface_hub's (file_download.py, try_to_load_from_cache and repo_folder_name):
///   <cache>/models--<org>--<name>/refs/<branch or tag>    a file holding the commit hash
///   <cache>/models--<org>--<name>/snapshots/<commit>/...   the repository's files, each a symlink
///                                                          into ../../blobs/<hash>

#include <optional>
#include <string>
#include <vector>

#include "remat/export.h"

namespace remat::io {

/// The hub cache directory and what chose it.
struct HubCacheLocation {
  std::string directory;
  /// "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME" or "the default".
  std::string chosen_by;
};

/// huggingface_hub's choice (constants.py): $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE (its older
/// name), else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
/// A leading "~" is the home directory, as os.path.expanduser makes it.
REMAT_API HubCacheLocation hub_cache_location();

/// Whether `text` is a model id with a namespace, "org/name", by huggingface_hub's rules
/// (utils/_validators.py validate_repo_id): each part 1-96 of [A-Za-z0-9_.-], not starting or
/// ending with '-' or '.', no "--" or "..", not ending in ".git". Says nothing about whether such a
/// repository exists.
REMAT_API bool is_hub_model_id(const std::string& text);

/// A revision of a repository in the cache.
struct HubSnapshot {
  std::string repo_id;    ///< as asked for
  std::string revision;   ///< as asked for: a branch, a tag or a commit hash
  std::string commit;     ///< the 40-digit commit the revision points at
  std::string directory;  ///< <cache>/models--<org>--<name>/snapshots/<commit>
};

/// The command that fetches `repo_id` at `revision` (only `files`, when given) into the cache:
/// huggingface_hub's CLI, "hf download <id> [files...] --revision <revision>".
REMAT_API std::string hub_download_command(const std::string& repo_id, const std::string& revision,
                                           const std::vector<std::string>& files = {});

/// Finds `repo_id` at `revision` in the cache, offline. The repository folder matches the id
/// ignoring case, as the hub matches ids (an exact match first). `revision` is a commit hash (40
/// hex digits) or a name under refs/ ("main", a tag, "refs/pr/1"). Every name in `required_files`
/// (relative paths) must resolve to a regular file in the snapshot: a symlink whose blob is gone
/// counts as missing. Throws c10::ValueError starting with "[<component>]" that names the id, the
/// revision, every path looked at, the missing files and hub_download_command.
REMAT_API HubSnapshot find_hub_snapshot(const std::string& repo_id, const std::string& revision,
                                        const std::vector<std::string>& required_files = {},
                                        const std::string& component = "hub");

/// The one rule of every option that takes a model path: a value that exists on disk, or is not
/// a model id, is a local path (nullopt: use it as given); otherwise it is looked up with
/// find_hub_snapshot (which throws when the cache lacks it).
REMAT_API std::optional<HubSnapshot> hub_snapshot_unless_local(const std::string& path_or_id,
                                                              const std::string& revision,
                                                              const std::vector<std::string>& required_files = {},
                                                              const std::string& component = "hub");

}  // namespace remat::io
