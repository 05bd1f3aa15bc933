#pragma once
/// \file
/// What a training run shows and records: a progress bar on a terminal (plain log lines
/// otherwise), one JSON record per step in metrics.jsonl, and the summary at the end.

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "remat/duration.h"
#include "remat/export.h"

namespace remat::train {

/// One optimizer step, as reported.
struct StepRecord {
  int64_t step = 0;            ///< 1-based optimizer step
  double loss = 0;             ///< mean flow-matching loss over the step's micro-batches
  double learning_rate = 0;
  double grad_norm = 0;        ///< total gradient norm before clipping
  double step_seconds = 0;     ///< wall time of the step (forward, backward, optimizer)
  int64_t peak_bytes = 0;      ///< peak tracked bytes during the step (device of the run)
};

/// Appends one JSON object per line to `path`, flushed after each record so a crash loses at
/// most the line being written.
class REMAT_API MetricsWriter {
 public:
  /// `append` keeps existing records (a resumed run continues the file).
  MetricsWriter(const std::string& path, bool append);
  void write(const StepRecord& record);

 private:
  std::ofstream out_;
  std::string path_;
};

/// Durations in progress lines: "1m05s" / "12.3s" / "850ms" (remat/duration.h).
using remat::format_duration;

/// The progress display. On a terminal it redraws one line:
///   step 12/60 [#####.......] loss 0.4231 lr 1.0e-04 1.23s/step ETA 59s peak 812.0 MiB
/// elsewhere it prints that line every `log_every` steps and at the last step.
class REMAT_API ProgressReporter {
 public:
  ProgressReporter(int64_t total_steps, bool is_terminal, std::FILE* out = stdout,
                   int64_t log_every = 1);
  void update(const StepRecord& record);
  /// Ends the redrawn line (terminal mode).
  void finish();
  /// Whether `stream` is a terminal.
  static bool stream_is_terminal(std::FILE* stream);

 private:
  std::string line(const StepRecord& record) const;
  int64_t total_;
  bool terminal_;
  std::FILE* out_;
  int64_t log_every_;
  std::vector<double> recent_step_seconds_;
  bool drew_ = false;
};

/// End-of-run figures.
struct RunSummary {
  int64_t steps = 0;
  double median_step_seconds = 0;
  int64_t peak_bytes = 0;
  double first_loss = 0;
  double final_loss = 0;          ///< mean of the last min(10, steps) losses (one step is noisy)
  double initial_loss_avg = 0;    ///< mean of the first min(10, steps) losses
  double total_seconds = 0;
};

REMAT_API RunSummary summarize(const std::vector<StepRecord>& records);
REMAT_API std::string format_summary(const RunSummary& summary);

}  // namespace remat::train
