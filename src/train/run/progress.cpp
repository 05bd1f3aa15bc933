#include "remat/train/run/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "remat/memory.h"
#include "remat/stats.h"

namespace remat::train {
namespace {

std::string printf_string(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return buffer;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc), path_(path) {
  TORCH_CHECK_VALUE(out_.good(), "[metrics] cannot open ", path, " for writing");
}

void MetricsWriter::write(const StepRecord& r) {
  nlohmann::json record{{"step", r.step},
                        {"loss", r.loss},
                        {"learning_rate", r.learning_rate},
                        {"grad_norm", r.grad_norm},
                        {"step_seconds", r.step_seconds},
                        {"peak_bytes", r.peak_bytes}};
  out_ << record.dump() << '\n';
  out_.flush();
  TORCH_CHECK(out_.good(), "[metrics] writing ", path_, " failed");
}

ProgressReporter::ProgressReporter(int64_t total_steps, bool is_terminal, std::FILE* out,
                                   int64_t log_every)
    : total_(std::max<int64_t>(total_steps, 1)),
      terminal_(is_terminal),
      out_(out),
      log_every_(std::max<int64_t>(log_every, 1)) {}

bool ProgressReporter::stream_is_terminal(std::FILE* stream) { return isatty(fileno(stream)) != 0; }

std::string ProgressReporter::line(const StepRecord& r) const {
  // The ETA uses the median of recent steps: the first steps (warm-up, allocation) are slower.
  const double per_step = median(recent_step_seconds_);
  const double eta = per_step * static_cast<double>(std::max<int64_t>(total_ - r.step, 0));
  std::ostringstream out;
  out << "step " << r.step << "/" << total_;
  if (terminal_) {
    constexpr int kWidth = 20;
    const int filled = static_cast<int>(kWidth * r.step / total_);
    out << " [" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "]";
  }
  out << " loss " << printf_string("%.4f", r.loss) << " lr " << printf_string("%.1e", r.learning_rate)
      << " " << format_duration(r.step_seconds) << "/step"
      << " ETA " << format_duration(eta) << " peak " << memory::format_bytes(r.peak_bytes);
  return out.str();
}

void ProgressReporter::update(const StepRecord& record) {
  recent_step_seconds_.push_back(record.step_seconds);
  if (recent_step_seconds_.size() > 20) recent_step_seconds_.erase(recent_step_seconds_.begin());
  if (terminal_) {
    std::fprintf(out_, "\r\033[K%s", line(record).c_str());
    drew_ = true;
  } else if (record.step % log_every_ == 0 || record.step == total_ || record.step == 1) {
    std::fprintf(out_, "%s\n", line(record).c_str());
  }
  std::fflush(out_);
}

void ProgressReporter::finish() {
  if (terminal_ && drew_) std::fprintf(out_, "\n");
  std::fflush(out_);
}

RunSummary summarize(const std::vector<StepRecord>& records) {
  RunSummary s;
  s.steps = static_cast<int64_t>(records.size());
  if (records.empty()) return s;
  std::vector<double> times;
  for (const auto& r : records) {
    times.push_back(r.step_seconds);
    s.peak_bytes = std::max(s.peak_bytes, r.peak_bytes);
    s.total_seconds += r.step_seconds;
  }
  s.median_step_seconds = median(times);
  s.first_loss = records.front().loss;
  const size_t window = std::min<size_t>(10, records.size());
  double head = 0, tail = 0;
  for (size_t i = 0; i < window; ++i) {
    head += records[i].loss;
    tail += records[records.size() - 1 - i].loss;
  }
  s.initial_loss_avg = head / static_cast<double>(window);
  s.final_loss = tail / static_cast<double>(window);
  return s;
}

std::string format_summary(const RunSummary& s) {
  std::ostringstream out;
  out << "summary: " << s.steps << " steps in " << format_duration(s.total_seconds)
      << ", median step " << format_duration(s.median_step_seconds) << ", peak memory "
      << memory::format_bytes(s.peak_bytes) << "\n"
      << "         loss " << printf_string("%.4f", s.initial_loss_avg) << " (mean of first steps) -> "
      << printf_string("%.4f", s.final_loss) << " (mean of last steps)";
  return out.str();
}

}  // namespace remat::train
