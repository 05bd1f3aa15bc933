// The caching phase's progress display: a redrawn bar with rate and ETA on a terminal, plain
// lines elsewhere (logs and CI keep a readable record without carriage returns).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "caches_internal.h"
#include "remat/duration.h"

namespace remat::data::detail {

CacheProgress::CacheProgress(std::string label, std::string unit, int64_t total, bool terminal,
                             std::function<void(const std::string&)> log)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      terminal_(terminal),
      log_(std::move(log)),
      start_(std::chrono::steady_clock::now()) {}

double CacheProgress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string CacheProgress::line() const {
  const double seconds = elapsed_seconds();
  const double rate = seconds > 0 ? static_cast<double>(done_) / seconds : 0.0;
  char figures[160];
  std::snprintf(figures, sizeof(figures), "%lld/%lld %s, %.2f %s/s", static_cast<long long>(done_),
                static_cast<long long>(total_), unit_.c_str(), rate, unit_.c_str());
  std::string out = label_ + " ";
  if (terminal_) {
    constexpr int kWidth = 24;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * done_ / total_) : kWidth;
    out += "[" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "] ";
  }
  out += figures;
  if (done_ < total_ && rate > 0) {
    out += ", ETA " + format_duration(static_cast<double>(total_ - done_) / rate);
  } else if (done_ == total_) {
    out += ", " + format_duration(seconds);
  }
  return out;
}

void CacheProgress::advance() {
  ++done_;
  if (terminal_) {
    std::fprintf(stderr, "\r%s\033[K", line().c_str());
    std::fflush(stderr);
    return;
  }
  // About ten plain lines per phase, and always the last one.
  const int64_t every = std::max<int64_t>(1, total_ / 10);
  if (done_ % every == 0 || done_ == total_) {
    log_(line());
    last_logged_ = done_;
  }
}

void CacheProgress::finish() {
  if (terminal_) {
    if (total_ > 0) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  } else if (last_logged_ != done_ && total_ > 0) {
    log_(line());
    last_logged_ = done_;
  }
}

}  // namespace remat::data::detail
