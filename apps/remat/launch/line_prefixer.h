#pragma once
// Splits a worker's output stream into whole lines, each prefixed with the worker's rank, so the
// launcher can write every line in one piece: lines of different workers never interleave.

#include <cstddef>
#include <string>

namespace remat::cli::launch {

/// Turns chunks of a byte stream (as read() returns them, lines split anywhere) into whole
/// lines, each `prefix` + text + '\n'. A line ends at '\n', at "\r\n", and at a lone '\r' (a
/// progress bar's redraw becomes one line per redraw; empty redraws are dropped). A line longer
/// than `max_line` bytes is cut into pieces of that size, so memory stays bounded.
class LinePrefixer {
 public:
  explicit LinePrefixer(std::string prefix, size_t max_line = 64 * 1024);

  /// Appends `size` bytes; returns the lines they complete (possibly ""), ready to write.
  std::string feed(const char* data, size_t size);

  /// At the end of the stream: the unterminated last line, prefixed and ended by '\n', or "".
  std::string finish();

 private:
  void emit(std::string& out);

  std::string prefix_;
  size_t max_line_;
  std::string line_;
  bool pending_cr_ = false;  // the last byte was a '\r': a '\n' next makes "\r\n", anything else a redraw
  bool just_cut_ = false;    // a line was just cut at max_line: a '\n' or "\r\n" next ends nothing more
};

}  // namespace remat::cli::launch
