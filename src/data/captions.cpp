// Captions by SimpleTuner's caption strategies (helpers/prompts.py PromptHandler.magic_prompt and
// prepare_instance_prompt_from_*; factory.py decides use_captions):
// - filename: the file name without its extension, underscores turned into spaces, nothing else.
// - textfile: IMAGE.txt beside the image (the image path with its extension replaced), UTF-8.
//   Text with a newline is split into lines and empty lines dropped; every line is a caption
//   variant. Text without a newline is used as it is (not stripped).
// - instanceprompt: the instance_prompt, stripped.
// - only_instance_prompt (any strategy): the instance_prompt as it is, for every image.
// - prepend_instance_prompt: instance_prompt + " " + caption, for every variant.
// remat's deviations: a carriage return ending a line is dropped (text files written on Windows);
// SimpleTuner picks a variant at random for every batch, remat once per cache entry
// (variant_key % number of variants), so that each cache entry holds one caption's embedding.
#include <algorithm>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

#include "remat/data/image_dataset.h"
#include "remat/encoders/clip_tokenizer.h"
#include "utf8.h"

namespace remat::data {
namespace {

// Caption files are small; a larger one is not a caption file.
constexpr int64_t kMaxCaptionFileBytes = 1 << 20;

std::string stem_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t dot = name.find_last_of('.');
  if (dot != std::string::npos && dot != 0) name.resize(dot);
  return name;
}

std::string without_extension(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) return path;
  return path.substr(0, dot);
}

std::string strip(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  const size_t first = s.find_first_not_of(ws);
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(ws) - first + 1);
}

// The caption variants of a text file, or nullopt with `problem` set.
std::optional<std::vector<std::string>> read_caption_file(const std::string& path, std::string* problem) {
  const auto say = [&](const std::string& what) {
    if (problem) *problem = what;
    return std::nullopt;
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return say("no caption file " + path);
  if (!S_ISREG(st.st_mode)) return say("caption file " + path + " is not a regular file");
  if (st.st_size > kMaxCaptionFileBytes) {
    return say("caption file " + path + " is larger than " + std::to_string(kMaxCaptionFileBytes) + " bytes");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return say("caption file " + path + " cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return say("caption file " + path + " cannot be read");
  const std::string content = text.str();
  std::vector<std::string> variants;
  if (content.find('\n') == std::string::npos) {
    variants.push_back(content);
  } else {
    std::istringstream lines(content);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) variants.push_back(line);
    }
  }
  if (variants.empty() || std::all_of(variants.begin(), variants.end(),
                                      [](const std::string& v) { return strip(v).empty(); })) {
    return say("caption file " + path + " is empty");
  }
  return variants;
}

}  // namespace

std::optional<std::string> caption_of(const std::string& image_path, const ImageDatasetConfig& config,
                                      uint64_t variant_key, std::string* problem) {
  const auto none = [&](const std::string& what) -> std::optional<std::string> {
    if (problem) *problem = what;
    return std::nullopt;
  };
  const std::string prompt = config.instance_prompt.value_or("");
  if (config.caption_strategy == CaptionStrategy::instanceprompt) {
    const std::string stripped = strip(prompt);
    if (stripped.empty()) return none("caption_strategy instanceprompt needs a non-empty instance_prompt");
    return stripped;
  }
  if (config.only_instance_prompt) {
    if (prompt.empty()) return none("only_instance_prompt needs an instance_prompt");
    return prompt;
  }
  std::vector<std::string> variants;
  const std::string caption_file = without_extension(image_path) + ".txt";
  if (config.caption_strategy == CaptionStrategy::filename) {
    std::string caption = stem_of(image_path);
    std::replace(caption.begin(), caption.end(), '_', ' ');
    variants.push_back(caption);
  } else {
    auto read = read_caption_file(caption_file, problem);
    if (!read) return std::nullopt;
    variants = std::move(*read);
  }
  std::string caption = variants[variant_key % variants.size()];
  if (config.prepend_instance_prompt) caption = prompt + " " + caption;
  if (strip(caption).empty()) return none("the caption of " + image_path + " is empty");
  // Checked here, where the file is known, so that a bad caption skips its picture with a warning
  // naming the file instead of stopping the text encoders mid-run.
  const std::string source = config.caption_strategy == CaptionStrategy::textfile ? "caption file " + caption_file
                                                                                   : "the caption of " + image_path;
  if (const auto bad = remat::detail::invalid_utf8_at(caption)) {
    return none(source + " is not valid UTF-8 (byte " + std::to_string(*bad) + ")");
  }
  if (caption.size() > encoders::kMaxClipCaptionBytes) {
    return none(source + " holds a caption of " + std::to_string(caption.size()) + " bytes; the text encoders take at most " +
                std::to_string(encoders::kMaxClipCaptionBytes));
  }
  return caption;
}

}  // namespace remat::data
