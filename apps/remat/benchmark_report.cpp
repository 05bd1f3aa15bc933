// The outputs of `remat bench`: text table, JSON, CSV, SVG chart, atomic file writes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <stdexcept>


#include <nlohmann/json.hpp>

#include "string_helpers.h"

#include "remat/util/error.h"
#include "remat/memory.h"
#include "benchmark_report.h"

namespace remat::cli {
using namespace remat::train;
namespace {

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(digits);
  out << value;
  return out.str();
}

std::string signed_percent(double value) { return (value >= 0 ? "+" : "") + fixed(value, 2) + "%"; }

using remat::detail::html_escape;

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

std::string format_benchmark_table(const BenchmarkReport& report) {
  // A precision column when any record quantises its base (remat bench --base_model_precision).
  const bool precisions = std::any_of(report.records.begin(), report.records.end(),
                                      [](const BenchmarkRecord& r) { return r.base_model_precision != "no_change"; });
  std::vector<std::string> header = {"layout", "step (s)", "forward (s)", "backward (s)",
                                     "peak", "predicted peak", "error", "predicted step (s)"};
  if (precisions) header.insert(header.begin(), "base precision");
  std::vector<std::vector<std::string>> rows = {header};
  for (const auto& r : report.records) {
    rows.push_back({r.layout, fixed(r.median_step_s, 4), fixed(r.median_forward_s, 4),
                    fixed(r.median_backward_s, 4), memory::format_bytes(r.peak_bytes),
                    memory::format_bytes(r.predicted_peak_bytes), signed_percent(r.peak_error_pct),
                    fixed(r.predicted_step_s, 4)});
    if (precisions) rows.back().insert(rows.back().begin(), r.base_model_precision);
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::ostringstream out;
  for (const auto& [key, value] : report.facts) out << key << ": " << value << "\n";
  out << "\n";
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t i = 0; i < rows[r].size(); ++i) {
      out << (i ? " | " : "") << std::left << std::setw(static_cast<int>(width[i])) << rows[r][i];
    }
    out << "\n";
    if (r == 0) {
      for (size_t i = 0; i < width.size(); ++i) out << (i ? "-+-" : "") << std::string(width[i], '-');
      out << "\n";
    }
  }
  out << "\n";
  for (const auto& r : report.records) {
    if (r.budget_bytes > 0) out << r.layout << " ran: " << r.chosen << "\n";
  }
  out << "worst peak prediction error: " << fixed(report.worst_peak_error_pct, 2) << "%\n";
  if (report.overhead_ratio) {
    out << "overhead of per-block checkpointing (\"1\"): step / (step of \"off\" + profiled forward of "
        << "every block) = " << fixed(*report.overhead_ratio, 3)
        << "; with the measured forward of \"off\" instead: " << fixed(*report.overhead_ratio_measured_forward, 3)
        << "\n";
  }
  return out.str();
}

std::string benchmark_json(const BenchmarkReport& report) {
  nlohmann::json records = nlohmann::json::array();
  for (const auto& r : report.records) {
    nlohmann::json j = {{"base_model_precision", r.base_model_precision},
                        {"layout", r.layout},
                        {"chosen_layout", r.chosen},
                        {"median_step_s", r.median_step_s},
                        {"median_forward_s", r.median_forward_s},
                        {"median_backward_s", r.median_backward_s},
                        {"median_optimizer_s", r.median_optimizer_s},
                        {"peak_bytes", r.peak_bytes},
                        {"predicted_peak_bytes", r.predicted_peak_bytes},
                        {"predicted_step_s", r.predicted_step_s},
                        {"peak_error_pct", r.peak_error_pct}};
    if (r.budget_bytes > 0) j["budget_bytes"] = r.budget_bytes;
    if (r.layout == "1" && report.overhead_ratio) {
      j["overhead_ratio"] = *report.overhead_ratio;
      j["overhead_ratio_measured_forward"] = *report.overhead_ratio_measured_forward;
    }
    for (const auto& [key, value] : report.facts) j["facts"][key] = value;
    records.push_back(j);
  }
  return records.dump(2) + "\n";
}

std::string benchmark_csv(const BenchmarkReport& report) {
  std::ostringstream out;
  out << "base_model_precision,layout,chosen_layout,median_step_s,median_forward_s,median_backward_s,"
         "median_optimizer_s,peak_bytes,predicted_peak_bytes,predicted_step_s,peak_error_pct,budget_bytes\n";
  out << std::setprecision(9);
  for (const auto& r : report.records) {
    out << csv_field(r.base_model_precision) << ',' << csv_field(r.layout) << ',' << csv_field(r.chosen) << ',' << r.median_step_s << ','
        << r.median_forward_s << ',' << r.median_backward_s << ',' << r.median_optimizer_s << ','
        << r.peak_bytes << ',' << r.predicted_peak_bytes << ',' << r.predicted_step_s << ','
        << r.peak_error_pct << ',' << r.budget_bytes << "\n";
  }
  return out.str();
}

std::string benchmark_svg(const BenchmarkReport& report) {
  const double width = 720, height = 480, left = 90, right = 30, top = 40, bottom = 60;
  double max_s = 0, max_b = 0;
  for (const auto& r : report.records) {
    max_s = std::max(max_s, r.median_step_s);
    max_b = std::max(max_b, static_cast<double>(r.peak_bytes));
  }
  max_s = max_s > 0 ? max_s * 1.1 : 1.0;
  max_b = max_b > 0 ? max_b * 1.1 : 1.0;
  const double mib = 1024.0 * 1024.0;
  const auto x = [&](double s) { return left + (width - left - right) * s / max_s; };
  const auto y = [&](double b) { return height - bottom - (height - top - bottom) * b / max_b; };
  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out << "<text x=\"" << width / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">"
      << "Peak memory against step time per checkpoint layout</text>\n";
  // Axes with five ticks each.
  out << "<line x1=\"" << left << "\" y1=\"" << height - bottom << "\" x2=\"" << width - right << "\" y2=\""
      << height - bottom << "\" stroke=\"black\"/>\n";
  out << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << height - bottom
      << "\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 5; ++i) {
    const double s = max_s * i / 5, b = max_b * i / 5;
    out << "<line x1=\"" << x(s) << "\" y1=\"" << height - bottom << "\" x2=\"" << x(s) << "\" y2=\""
        << height - bottom + 5 << "\" stroke=\"black\"/>\n";
    out << "<text x=\"" << x(s) << "\" y=\"" << height - bottom + 18 << "\" text-anchor=\"middle\">"
        << fixed(s, 3) << "</text>\n";
    out << "<line x1=\"" << left - 5 << "\" y1=\"" << y(b) << "\" x2=\"" << left << "\" y2=\"" << y(b)
        << "\" stroke=\"black\"/>\n";
    out << "<text x=\"" << left - 8 << "\" y=\"" << y(b) + 4 << "\" text-anchor=\"end\">" << fixed(b / mib, 1)
        << "</text>\n";
  }
  out << "<text x=\"" << (left + width - right) / 2 << "\" y=\"" << height - 15
      << "\" text-anchor=\"middle\">median step time (s)</text>\n";
  out << "<text x=\"20\" y=\"" << (top + height - bottom) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 "
      << (top + height - bottom) / 2 << ")\">peak memory (MiB)</text>\n";
  for (const auto& r : report.records) {
    const double px = x(r.median_step_s), py = y(static_cast<double>(r.peak_bytes));
    out << "<circle cx=\"" << px << "\" cy=\"" << py << "\" r=\"4\" fill=\"#1f77b4\"/>\n";
    out << "<text x=\"" << px + 6 << "\" y=\"" << py - 6 << "\">" << html_escape(r.layout) << "</text>\n";
  }
  out << "</svg>\n";
  return out.str();
}

}  // namespace remat::cli
