#pragma once
// The checkpointing options' help in the six languages of the docs, for the page's language
// switch: English from the options registry, the others read from the embedded translations
// (docs/OPTIONS.<lang>.md, compiled in), so the page and the docs cannot disagree.

#include <nlohmann/json.hpp>

namespace remat::ui::detail {

/// [{"code": "en", "name": "English", "options": {"<option>": {"title", "help", "tooltip",
///   "items": [{"label", "text", "items"?: [sub-line, ...]}]}}}, {"code": "zh", ...}, ...]: each checkpointing option's
/// heading, its "What" and "Note" lines (help, tooltip) and every line of its entry.
nlohmann::json help_translations();

}  // namespace remat::ui::detail
