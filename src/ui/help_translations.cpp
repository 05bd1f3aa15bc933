#include "help_translations.h"

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "embedded_files.h"
#include "remat/train/options/options.h"

namespace remat::ui::detail {
namespace {

struct Language {
  const char* code;
  const char* name;
};
// The languages of docs/OPTIONS.<code>.md, as docs/OPTIONS.md links them.
const Language kTranslations[] = {
    {"zh", "中文"}, {"ja", "日本語"}, {"es", "Español"}, {"pt-BR", "Português (Brasil)"}, {"hi", "हिन्दी"}};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// One translated file: "### `--name`" headings, each followed by "- **Label**: text" lines (the
// colon may be the full-width one), a line's indented "  - " sub-lines (the choices' labels) as
// its "items". Every translation lists Type, Default, What, Note first, in
// that order, as docs/OPTIONS.md does (tests/train/options/docs_test.cpp checks the files' structure).
nlohmann::json parse_translation(std::string_view markdown) {
  nlohmann::json options = nlohmann::json::object();
  std::istringstream in{std::string(markdown)};
  std::string line;
  std::string current;
  while (std::getline(in, line)) {
    if (line.rfind("### `--", 0) == 0) {
      const size_t end = line.find('`', 7);
      current = end == std::string::npos ? "" : line.substr(7, end - 7);
      if (!current.empty()) options[current] = {{"items", nlohmann::json::array()}};
      continue;
    }
    // "  - `torch`: label" under a "- **Choices**:" line: the labels of the choices, kept with it.
    if (!current.empty() && line.rfind("  - ", 0) == 0 && !options[current]["items"].empty()) {
      auto& last = options[current]["items"].back();
      if (!last.contains("items")) last["items"] = nlohmann::json::array();
      last["items"].push_back(trim(line.substr(4)));
      continue;
    }
    if (current.empty() || line.rfind("- **", 0) != 0) continue;
    const size_t label_end = line.find("**", 4);
    if (label_end == std::string::npos) continue;
    std::string text = line.substr(label_end + 2);
    for (const std::string colon : {"：", ":"}) {
      if (text.rfind(colon, 0) == 0) {
        text = text.substr(colon.size());
        break;
      }
    }
    options[current]["items"].push_back({{"label", line.substr(4, label_end - 4)}, {"text", trim(text)}});
  }
  for (auto& entry : options) {
    const auto& items = entry["items"];
    entry["help"] = items.size() > 2 ? items[2]["text"] : nlohmann::json("");
    entry["tooltip"] = items.size() > 3 ? items[3]["text"] : nlohmann::json("");
  }
  return options;
}

}  // namespace

nlohmann::json help_translations() {
  nlohmann::json languages = nlohmann::json::array();
  nlohmann::json english = nlohmann::json::object();
  for (const auto& spec : train::option_specs()) {
    if (!spec.checkpointing) continue;
    english[spec.name] = {{"help", spec.help}, {"tooltip", spec.tooltip}, {"items", nlohmann::json::array()}};
  }
  languages.push_back({{"code", "en"}, {"name", "English"}, {"options", english}});
  for (const auto& language : kTranslations) {
    const EmbeddedFile* file = find_embedded_file(std::string("help/OPTIONS.") + language.code + ".md");
    if (file == nullptr) continue;
    languages.push_back(
        {{"code", language.code}, {"name", language.name}, {"options", parse_translation(file->bytes())}});
  }
  return languages;
}

}  // namespace remat::ui::detail
