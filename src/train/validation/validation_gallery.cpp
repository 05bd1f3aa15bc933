// output_dir/validation_images/index.html: every step's validation pictures side by side. Built
// from the files in the folder, not from memory, so a resumed run's page still shows the steps
// rendered before the interruption. Plain HTML and inline CSS: it opens from disk, offline.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <tuple>

#include "string_helpers.h"
#include "remat/util/files.h"
#include "remat/train/validation/validation_images.h"

namespace remat::train {
namespace {
namespace fs = std::filesystem;

using remat::detail::html_escape;

// A file name in an href: the names are ours (digits, the shortname, "x"), but a shortname may
// hold spaces, '#', '?' or '%', which a URL reads otherwise.
std::string escape_href(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

struct Column {
  int prompt_rank;  // position in the run's prompts; unknown shortnames after them
  std::string shortname;
  int64_t index;
  std::string resolution;
  bool ema;  // rendered with the EMA weights: right after the same picture's trained-weights column
  bool operator<(const Column& o) const {
    return std::tie(prompt_rank, shortname, index, resolution, ema) <
           std::tie(o.prompt_rank, o.shortname, o.index, o.resolution, o.ema);
  }
};

}  // namespace

void write_validation_gallery(const std::string& dir, const std::vector<ValidationPrompt>& prompts) {
  // step_{step}_{shortname}_{idx}_{W}x{H}[_ema].png; the shortname may itself contain '_'.
  static const std::regex name_re(R"(step_([0-9]+)_(.+)_([0-9]+)_([0-9]+x[0-9]+)(_ema)?\.png)");
  std::map<std::string, int> rank;
  for (size_t i = 0; i < prompts.size(); ++i) rank.emplace(prompts[i].shortname, static_cast<int>(i));
  std::map<int64_t, std::map<Column, std::string>> rows;  // step -> column -> file
  std::set<Column> columns;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, name_re) || m[1].str().size() > 12 || m[3].str().size() > 9) continue;
    const auto found = rank.find(m[2].str());
    Column column{found == rank.end() ? static_cast<int>(prompts.size()) : found->second, m[2].str(),
                  std::stoll(m[3].str()), m[4].str(), m[5].matched};
    columns.insert(column);
    rows[std::stoll(m[1].str())][column] = name;
  }

  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>Validation images</title>\n<style>\n"
      "body { font-family: sans-serif; margin: 1em; }\n"
      "table { border-collapse: collapse; }\n"
      "th, td { border: 1px solid #ccc; padding: 4px; vertical-align: top; text-align: center; }\n"
      "th.step { text-align: right; white-space: nowrap; }\n"
      "img { max-width: 256px; max-height: 256px; image-rendering: pixelated; }\n"
      ".prompt { font-weight: normal; font-size: 0.85em; max-width: 256px; }\n"
      "</style>\n</head>\n<body>\n<h1>Validation images</h1>\n"
      "<p>One row per training step (step 0: before training), one column per prompt and resolution "
      "(and one more for the EMA weights when the run keeps them). "
      "Click a picture for full size.</p>\n<table>\n<tr><th>step</th>";
  for (const auto& c : columns) {
    const std::string prompt = c.prompt_rank < static_cast<int>(prompts.size()) ? prompts[c.prompt_rank].prompt : "";
    html += "<th>" + html_escape(c.shortname) + " #" + std::to_string(c.index) + "<br>" + html_escape(c.resolution) +
            (c.ema ? "<br>EMA weights" : "") +
            "<div class=\"prompt\">" + (prompt.empty() ? std::string("(empty prompt)") : html_escape(prompt)) +
            "</div></th>";
  }
  html += "</tr>\n";
  for (const auto& [step, files] : rows) {
    html += "<tr><th class=\"step\">" + std::to_string(step) + "</th>";
    for (const auto& c : columns) {
      const auto it = files.find(c);
      if (it == files.end()) {
        html += "<td></td>";
        continue;
      }
      const std::string href = escape_href(it->second);
      html += "<td><a href=\"" + href + "\"><img src=\"" + href + "\" alt=\"" + html_escape(it->second) +
              "\" title=\"" + html_escape(it->second) + "\"></a></td>";
    }
    html += "</tr>\n";
  }
  html += "</table>\n</body>\n</html>\n";
  util::write_file_atomically((fs::path(dir) / "index.html").string(), html, "train");
}

}  // namespace remat::train
