#include "launch/line_prefixer.h"

#include <utility>

namespace remat::cli::launch {

LinePrefixer::LinePrefixer(std::string prefix, size_t max_line)
    : prefix_(std::move(prefix)), max_line_(max_line == 0 ? 1 : max_line) {}

void LinePrefixer::emit(std::string& out) {
  out += prefix_;
  out += line_;
  out += '\n';
  line_.clear();
}

std::string LinePrefixer::feed(const char* data, size_t size) {
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    const char c = data[i];
    if (c == '\n') {
      // "\n" and "\r\n" end a line, an empty one too; right after a cut they end nothing more.
      if (!just_cut_) emit(out);
      pending_cr_ = just_cut_ = false;
      continue;
    }
    // A '\r' not followed by '\n' is a redraw ("\r 10%\r 20%"): it ends a line too; the empty
    // text before a bar's first redraw is dropped.
    if (pending_cr_ && !line_.empty()) emit(out);
    pending_cr_ = c == '\r';
    if (pending_cr_) continue;  // a cut just before stays one: "\r\n" after it ends nothing more
    just_cut_ = false;
    line_ += c;
    if (line_.size() >= max_line_) {
      emit(out);
      just_cut_ = true;
    }
  }
  return out;
}

std::string LinePrefixer::finish() {
  std::string out;
  if (!line_.empty()) emit(out);
  pending_cr_ = just_cut_ = false;
  return out;
}

}  // namespace remat::cli::launch
