#pragma once
// The outputs of `remat bench`: a text table, JSON, CSV and an SVG chart of a BenchmarkReport.
// They belong to the CLI, not to the library, which only measures.

#include <string>

#include "remat/train/memory/benchmark.h"

namespace remat::cli {

using train::BenchmarkReport;

/// A fixed-width text table of the records (and the overhead line).
std::string format_benchmark_table(const BenchmarkReport& report);
/// JSON: a list of one object per record (fields of BenchmarkRecord).
std::string benchmark_json(const BenchmarkReport& report);
/// CSV with a header row, the same fields.
std::string benchmark_csv(const BenchmarkReport& report);
/// A self-contained SVG scatter chart: peak memory (y) against step time (x), one labelled point
/// per layout.
std::string benchmark_svg(const BenchmarkReport& report);

}  // namespace remat::cli
