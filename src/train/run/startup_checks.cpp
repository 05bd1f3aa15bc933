// Startup checks of a run's paths and data (remat/train/run/startup_checks.h).
#include "remat/train/run/startup_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "remat/train/options/config.h"

namespace remat::train {
namespace fs = std::filesystem;
namespace {

// Creates and removes a file in `dir`: the one reliable test of "can I write here" (access(2)
// says yes to root on a read-only file system). Returns the errno text, or "" on success.
std::string probe_write(const std::string& dir) {
  std::string name = (fs::path(dir) / ".remat-write-probe-XXXXXX").string();
  const int fd = ::mkstemp(name.data());
  if (fd < 0) return std::strerror(errno);
  ::close(fd);
  ::unlink(name.c_str());
  return "";
}

}  // namespace

void check_output_dir(const std::string& dir) {
  const auto fail = [&](const std::string& why) {
    throw ValidationError("output_dir", dir,
                          "[train] output_dir must be a writable directory, got '" + dir + "': " + why);
  };
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) fail("it is not a directory");
  } else if (errno == ENOENT) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) fail("cannot create it: " + ec.message());
  } else {
    fail(std::strerror(errno));  // ELOOP (a symlink loop), ENOTDIR (under a file), EACCES ...
  }
  const std::string error = probe_write(dir);
  if (!error.empty()) fail("cannot create files in it: " + error);
}

void check_data_dir(const std::string& dir) {
  struct stat st {};
  std::string why;
  if (::stat(dir.c_str(), &st) != 0) {
    why = std::strerror(errno);
  } else if (!S_ISDIR(st.st_mode)) {
    why = "it is not a directory";
  } else if (::access(dir.c_str(), R_OK | X_OK) != 0) {
    why = std::strerror(errno);
  }
  if (!why.empty()) {
    throw ValidationError("instance_data_dir", dir,
                          "[train] instance_data_dir must be a readable directory of samples, got '" + dir +
                              "': " + why);
  }
}

namespace {

// The first width in which samples of `shape` and the model disagree.
struct WidthMismatch {
  std::string what;   // "prompt_embeds width D"
  int64_t data = 0;
  int64_t wanted = 0;
  std::string field;  // the model's name for it: "text width"
};

std::optional<WidthMismatch> width_mismatch(const SampleShape& shape, const ConditioningWidths& model) {
  if (model.text > 0 && shape.prompt_embeds[1] != model.text) {
    return WidthMismatch{"prompt_embeds width D", shape.prompt_embeds[1], model.text, "text width"};
  }
  if (model.pooled > 0 && !shape.pooled_prompt_embeds.empty() && shape.pooled_prompt_embeds[0] != model.pooled) {
    return WidthMismatch{"pooled_prompt_embeds width P", shape.pooled_prompt_embeds[0], model.pooled, "pooled width"};
  }
  if (model.channels > 0 && shape.latents[0] != model.channels) {
    return WidthMismatch{"latent channels C", shape.latents[0], model.channels, "latent channels"};
  }
  return std::nullopt;
}

}  // namespace

void check_dataset_fits_model(const LatentDataset& dataset, const ConditioningWidths& model,
                              const std::string& model_name) {
  if (dataset.size() == 0) return;
  // C, D and P agree across samples (open checks them), so the first sample speaks for all.
  const auto m = width_mismatch(dataset.shape(0), model);
  if (!m) return;
  throw ValidationError("instance_data_dir", dataset.directory(),
                        "[train] instance_data_dir '" + dataset.directory() + "' holds samples with " + m->what +
                            " = " + std::to_string(m->data) + " (e.g. '" + dataset.path(0) + "'), but " +
                            model_name + " reads " + std::to_string(m->wanted) + " (its " + m->field +
                            "); use data made for this model, or the model the data was made for");
}

void check_cached_images_fit_model(const MultiDataset& dataset, const ConditioningWidths& model,
                                   const std::string& model_name) {
  const auto shapes = dataset.bucket_shapes();
  if (shapes.empty()) return;
  const auto m = width_mismatch(shapes.front(), model);  // C, D and P agree across buckets
  if (!m) return;
  const auto& first = dataset.dataset(0).samples.front();
  throw ValidationError("pretrained_model_name_or_path", "",
                        "[train] the pipeline folder's encoders give " + m->what + " = " + std::to_string(m->data) +
                            " (e.g. '" + first.latents_path + "', '" + first.text_path + "'), but " + model_name +
                            " reads " + std::to_string(m->wanted) + " (its " + m->field +
                            "); use a transformer that matches the pipeline's VAE and text encoders");
}

void check_output_file(const std::string& path, const std::string& option) {
  const auto fail = [&](const std::string& why) {
    throw ValidationError(option, path, "[output] " + option + " must be a file in a writable directory, got '" +
                                            path + "': " + why);
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fail("it is a directory");
  const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  if (::stat(parent.c_str(), &st) != 0) fail("its directory '" + parent.string() + "': " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) fail("'" + parent.string() + "' is not a directory");
  const std::string error = probe_write(parent.string());
  if (!error.empty()) fail("cannot create files in '" + parent.string() + "': " + error);
}

}  // namespace remat::train
